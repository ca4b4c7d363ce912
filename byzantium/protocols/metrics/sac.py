"""The paper's metrics, from transcript records of SAC or CP-WBFT (rounds[t]["agents"][i]["answer"]).

Per instance:
    IAA   initial agent accuracy: share of ALL agents (adversary included, as the reference does) right
          at round 0
    FAA   final agent accuracy: the same at the last round
    BFTI  FAA - IAA
    RA    as the paper's tables compute it (the reference code): for SAC the plurality answer of the
          HONEST agents at the last round is right (so it equals H-Majority here); for CP-WBFT the
          global decision is right
    RA-all  ours: the plurality answer of ALL agents (adversary included) at the last round is right
    H-Majority  the plurality answer of the honest agents at the last round is right
    acc[group][t]  accuracy of "strong", "weak", "honest" agents at round t
Every comparison and every vote goes through the tasks' `normalize_answer` / `is_correct` (the
reference's RA used strict string equality while the others normalised). Votes are
`voting.plurality`, the same rule as MAJ: unreadable answers abstain, and a tie is drawn with a key
from the run seed and the problem id (the reference iterated a Python set, so its ties depended on
PYTHONHASHSEED). SAC's RA can follow the reference's tie rule instead (a record's "ra_ties" =
"first-honest", from `run sac --ra-ties first-honest`): the tied answer of the first honest agent in
the reference's agent order, where the weak honest agents come before the strong ones (its
Counter.most_common keeps insertion order). `summarize` averages over instances and counts, rather
than hides, what fell back: answers that did not parse, scores that fell back to 0.5 (no `Score:`) or
0.0 (the call raised), refinements that did not parse, CP-WBFT solves without `Confidence:` (read as 0.0), and
decoy adversaries that fell back to the fixed wrong answer.
"""
from ...tasks import is_correct, normalize_answer
from ..cpwbft import find_confidence
from ..plurality import plurality

# Failure counts summed over instances (every one is also in each instance's metrics).
COUNTS = ("answer_parse_failures", "score_failures", "score_errors", "refine_parse_failures",
          "confidence_missing", "decoy_fallbacks")

GROUPS = ("strong", "weak", "honest", "all")


def _members(record, group):
    roles = {a["id"]: a["role"] for a in record["agents"]}
    if group == "all":
        return list(roles)
    if group == "honest":
        return [i for i, r in roles.items() if r != "adversary"]
    return [i for i, r in roles.items() if r == group]


def _answers(record, t, ids):
    by_id = {a["id"]: a["answer"] for a in record["rounds"][t]["agents"]}
    return [by_id[i] for i in ids]


def accuracy(record, t, group="all"):
    """Share of `group` right at round t (None for an empty group)."""
    ids = _members(record, group)
    if not ids:
        return None
    return sum(is_correct(a, record["gold"], record["kind"]) for a in _answers(record, t, ids)) / len(ids)


def vote(record, answers):
    """The plurality answer of `answers` as an agent wrote it (the first of the winning group), so that
    is_correct reads an answer, not voting's canonical form; None when every voter abstained."""
    kind = record["kind"]
    winner = plurality(answers, kind, f"{record.get('seed', 0)}:{record.get('task_id')}").answer
    return next((a for a in answers if a is not None and normalize_answer(a, kind) == winner), winner)


RA_TIES = ("drawn", "first-honest")


def first_honest_vote(record, ids):
    """The reference's SAC RA vote: plurality of the honest agents `ids`, a tie going to the answer
    of the first of them in the reference's order (weak agents first, then strong, each by index)."""
    roles = {a["id"]: a["role"] for a in record["agents"]}
    ordered = sorted(ids, key=lambda i: (roles[i] != "weak", i))
    answers = _answers(record, len(record["rounds"]) - 1, ordered)
    counts = plurality(answers, record["kind"], "").counts
    if not counts:
        return None
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts.get(normalize_answer(a, record["kind"])) == top)


def instance_metrics(record) -> dict:
    last = len(record["rounds"]) - 1
    gold, kind = record["gold"], record["kind"]
    iaa, faa = accuracy(record, 0), accuracy(record, last)
    states = [a for r in record["rounds"] for a in r["agents"]]
    honest = _members(record, "honest")
    h_majority = float(is_correct(vote(record, _answers(record, last, honest)), gold, kind))
    if record.get("ra_ties", "drawn") not in RA_TIES:
        raise ValueError(f"unknown ra_ties {record['ra_ties']!r}; choose one of {', '.join(RA_TIES)}")
    sac_ra = float(is_correct(first_honest_vote(record, honest), gold, kind)) \
        if record.get("ra_ties") == "first-honest" else h_majority
    out = {"IAA": iaa, "FAA": faa, "BFTI": faa - iaa,
           "RA": float(is_correct(record.get("decision"), gold, kind)) if record.get("protocol") == "cpwbft"
           else sac_ra,
           "RA-all": float(is_correct(vote(record, _answers(record, last, _members(record, "all"))), gold, kind)),
           "H-Majority": h_majority,
           "acc": {g: [accuracy(record, t, g) for t in range(last + 1)] for g in GROUPS},
           "answer_parse_failures": sum(a.get("answer") is None for a in states),
           "score_failures": sum(a.get("score_failures", 0) for a in states),
           "score_errors": sum(len(a.get("score_errors") or ()) for a in states),
           "refine_parse_failures": sum(a.get("refine_parsed") is False for a in states),
           "confidence_missing": 0,
           "decoy_fallbacks": sum(bool(x.get("fell_back")) for x in record.get("adversaries", ()))}
    if record.get("protocol") == "cpwbft":
        out["rounds_run"] = record.get("rounds_run", last)
        # rounds[t >= 1] hold each round's fresh solve texts (round 0 repeats round 1's).
        out["confidence_missing"] = sum(a.get("text") is not None and find_confidence(a["text"]) is None
                                        for r in record["rounds"][1:] for a in r["agents"])
    return out


def judgements(record) -> int:
    """The judge calls SAC's honest agents made on one problem: each one's self-score in round 0, then per
    round one per neighbour plus a re-score, every round (record "rescore" = "always", the paper's) or when
    its answer changed ("changed", and records written before SAC re-scored every round); 0 for CP-WBFT,
    whose agents judge none."""
    if record.get("protocol") != "sac":
        return 0
    every_round = record.get("rescore", "changed") == "always"
    count = sum(1 for a in record["rounds"][0]["agents"] if "self_score" in a)
    for r in record["rounds"][1:]:
        count += sum(len(a["scores"]) + (every_round or a["answer"] != a["previous"]) for a in r["agents"]
                     if "scores" in a)
    return count


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(records) -> dict:
    """Means over instances of every metric; per-group accuracy per round (rounds padded with the last
    round for instances that stopped early, as CP-WBFT does); failure counts summed."""
    ms = [instance_metrics(r) for r in records]
    if not ms:
        return {"instances": 0}
    out = {"instances": len(ms)}
    for key in ("IAA", "FAA", "BFTI", "RA", "RA-all", "H-Majority", "rounds_run"):
        if any(key in m for m in ms):
            out[key] = _mean([m.get(key) for m in ms])
    rounds = max(len(m["acc"]["all"]) for m in ms)
    out["acc"] = {g: [_mean([m["acc"][g][min(t, len(m["acc"][g]) - 1)] for m in ms]) for t in range(rounds)]
                  for g in GROUPS}
    # The paper's "before -> after" per group: round 0 and the last round.
    out["group_accuracy"] = {g: {"before": out["acc"][g][0], "after": out["acc"][g][-1]} for g in GROUPS}
    for key in COUNTS:
        out[key] = sum(m.get(key, 0) for m in ms)
    return out
