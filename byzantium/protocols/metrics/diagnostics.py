"""What a reader needs beside every number: per run (a report's cell), how many replies could not be read
and, for SAC, what its filter did. summary.json keeps them under "diagnostics"; the report shows them
and flags a cell where a share of unreadable replies passes FLAG_SHARE.

    cell_diagnostics("sac", records) -> {
        "answers":      {"replies": 40, "unread": 3, "ambiguous": 1},   # answer-bearing replies, read again
        "judge_scores": {"replies": 263, "unparsed": 95},               # SAC: fell back to 0.5
        "confidences":  {"replies": 18, "unparsed": 18},                # CP-WBFT: read as 0.0
        "inspector":    {"replies": 3, "unparsed": 3},                  # resilience: invalid decisions
        "filter":       {"adversary": [1, 36], "weak": [5, 40], "strong": [23, 100]},  # dropped, judged
        "on_adversary": {"honest": 18, "on_adversary": 4}}             # final honest answers on its answer

Answer statuses come from the texts the records hold, read again with the answer reader (`read_answer`:
"read", "unread", or "ambiguous" when a reply commits to two answers at its end); the protocols keep only
the value. Keys a run does not have are left out.
"""
from ...tasks import answers as answer_reader
from ...tasks import is_correct, normalize_answer
from ..cpwbft import find_confidence
from .sac import judgements

FLAG_SHARE = 0.20  # a cell with more of its replies unreadable than this is flagged in the table itself
STATUSES = ("read", "unread", "ambiguous")
# The kinds of reply a cell's share is taken over, as a report names them.
KINDS = {"answers": "answers unread or ambiguous", "judge_scores": "judge scores unparsed",
         "confidences": "confidences missing", "inspector": "Inspector decisions invalid"}


def answer_status(text, kind, choices=None) -> str:
    """read | unread | ambiguous, by `read_answer` (by whether `extract_answer` finds a value where the
    reader has no status yet)."""
    read = getattr(answer_reader, "read_answer", None)
    if read is not None:
        status = read(text, kind, choices).status
        if status not in STATUSES:
            raise ValueError(f"read_answer gave an unknown status {status!r}")
        return status
    return "unread" if answer_reader.extract_answer(text, kind, choices) is None else "read"


def _reply_texts(method, record):
    """The texts of the replies that state an answer (honest agents' only: an adversary writes none)."""
    if method == "maj":
        return [a.get("text") for a in record.get("agents") or []]
    if method == "rr":
        return [record.get("text")]
    if method == "rrmaj":
        return [t.get("text") for t in record.get("trajectories") or []]
    if method in ("sac", "cpwbft"):
        first = 1 if method == "cpwbft" else 0  # CP-WBFT's round 0 repeats round 1's solves
        return [a["text"] for r in record["rounds"][first:] for a in r["agents"] if a.get("text") is not None]
    if method == "resilience":
        return [record.get("output")]
    raise ValueError(f"no answer-bearing replies known for method {method!r}")


def _kind(method, record):
    return (record.get("score") or {}).get("kind") if method == "resilience" else record.get("kind")


def answer_readings(method, records) -> dict:
    """{"replies", "unread", "ambiguous"} over the answer-bearing replies of the records."""
    counts = {"replies": 0, "unread": 0, "ambiguous": 0}
    for r in records:
        kind = _kind(method, r)
        if kind in (None, "code", "translation"):
            continue  # code and translations are scored whole, not read for a stated answer
        for text in _reply_texts(method, r):
            status = "unread" if text is None else answer_status(text, kind, r.get("choices"))
            counts["replies"] += 1
            if status != "read":
                counts[status] += 1
    return counts


def filter_drops(records) -> dict:
    """SAC: per role of the judged neighbour, [times the filter dropped it, times it was judged]."""
    out = {}
    for r in records:
        roles = {a["id"]: a["role"] for a in r["agents"]}
        for rnd in r["rounds"][1:]:
            for a in rnd["agents"]:
                for j in a.get("scores") or {}:
                    role = roles[int(j)]
                    got = out.setdefault(role, [0, 0])
                    got[0] += int(j) in {int(x) for x in a.get("dropped") or ()}
                    got[1] += 1
    return out


def on_adversary(records) -> dict:
    """Honest agents' final answers (read ones), and how many of them are an adversary's wrong answer
    (what it held or sent in the last round)."""
    honest = held = 0
    for r in records:
        kind, last = r["kind"], r["rounds"][-1]["agents"]
        theirs = set()
        for a in last:
            if a["role"] == "adversary":
                sent = [a.get("answer"), *(a.get("sent") or {}).values()]
                theirs |= {normalize_answer(x, kind) for x in sent if isinstance(x, str) and
                           not is_correct(x, r["gold"], kind)}
        for a in last:
            if a["role"] != "adversary" and a.get("answer") is not None:
                honest += 1
                held += normalize_answer(a["answer"], kind) in theirs
    return {"honest": honest, "on_adversary": held}


def cell_diagnostics(method, records) -> dict:
    """Every diagnostic the method's records support (see the module's notes)."""
    out = {"answers": answer_readings(method, records)}
    if method == "sac":
        out["judge_scores"] = {"replies": sum(judgements(r) for r in records),
                               "unparsed": sum(a.get("score_failures", 0) for r in records for rnd in r["rounds"]
                                               for a in rnd["agents"])}
        out["filter"] = filter_drops(records)
    if method == "cpwbft":
        texts = [a["text"] for r in records for rnd in r["rounds"][1:] for a in rnd["agents"]
                 if a.get("text") is not None]
        out["confidences"] = {"replies": len(texts), "unparsed": sum(find_confidence(t) is None for t in texts)}
    if method in ("sac", "cpwbft") and any(a["role"] == "adversary" for r in records for a in r["agents"]):
        out["on_adversary"] = on_adversary(records)
    if method == "resilience":
        stats = [r.get("stats") or {} for r in records]
        if any(s.get("inspected") for s in stats):
            out["inspector"] = {"replies": sum(s.get("inspected", 0) for s in stats),
                                "unparsed": sum(s.get("inspector_invalid", 0) for s in stats)}
    return out


def shares(diagnostics) -> dict:
    """{kind: (bad, replies)} of the unreadable replies per kind of reply (answers: unread + ambiguous)."""
    out = {}
    for key in KINDS:
        d = (diagnostics or {}).get(key)
        if d and d.get("replies"):
            bad = d["unread"] + d["ambiguous"] if key == "answers" else d["unparsed"]
            out[key] = (bad, d["replies"])
    return out


def flags(diagnostics, limit=FLAG_SHARE) -> list:
    """What makes a cell's numbers suspect: 'judge scores unparsed 36 % (95/263)', one per share over `limit`."""
    return [f"{KINDS[k]} {100 * bad / n:.0f} % ({bad}/{n})" for k, (bad, n) in shares(diagnostics).items()
            if bad / n > limit]
