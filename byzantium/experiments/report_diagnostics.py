"""The diagnostics beside a report's numbers (protocols/metrics/diagnostics.py, kept in each run's
summary.json): the columns that show them, the mark on a number whose cell has too many unreadable
replies, and the footnote that says why.

    mark(pct(ci), cell)          -> "45.0 [30.1, 60.2] W !" when a share passes FLAG_SHARE
    footnote([cell, ...])        -> "! ... cell: judge scores unparsed 36 % (95/263)" or None
A run written before the diagnostics were kept shows "-".
"""
from ..protocols.metrics.diagnostics import FLAG_SHARE, KINDS, flags, shares

MARK = "!"
MISSING = "-"
SHORT = {"judge_scores": "judge scores", "confidences": "confidences", "inspector": "Inspector"}


def of(cell):
    """The cell's diagnostics, or None (a run from before they were kept, or no summary)."""
    return (cell.summary or {}).get("diagnostics") if cell is not None else None


def cell_flags(cell) -> list:
    return flags(of(cell))


def mark(text, *cells) -> str:
    """The text with MARK when any of the cells is flagged (an empty text stays empty)."""
    return f"{text} {MARK}" if text not in ("", "–") and any(cell_flags(c) for c in cells if c) else text


def footnote(cells) -> str | None:
    """The note under a table that explains its marks, naming each flagged cell once."""
    seen = {}
    for c in cells:
        if c is not None and cell_flags(c):
            seen.setdefault(c.name, cell_flags(c))
    if not seen:
        return None
    return (f"{MARK} a share of the cell's replies that could not be read passes {100 * FLAG_SHARE:.0f} %, so its "
            "number partly measures the reading: " + "; ".join(f"{name}: {', '.join(f)}" for name, f in seen.items())
            + ".")


def answers(cell) -> str:
    """'3 unread, 1 ambiguous / 40': the answer-bearing replies read again."""
    d = (of(cell) or {}).get("answers")
    if not d:
        return MISSING
    return f"{d['unread']} unread, {d['ambiguous']} ambiguous / {d['replies']}" if d["replies"] else "0 replies"


def other_replies(cell) -> str:
    """'judge scores 95/263 (36 %)': the other kinds of reply a cell's protocol reads."""
    if of(cell) is None:
        return MISSING
    found = {k: v for k, v in shares(of(cell)).items() if k != "answers"}
    return "; ".join(f"{SHORT[k]} {bad}/{n} ({100 * bad / n:.0f} %)" for k, (bad, n) in found.items()) or "–"


def filter_drops(cell) -> str:
    """SAC: 'adversary 1/36, weak 5/40, strong 23/100': dropped / judged, per role of the judged agent."""
    d = of(cell)
    if d is None:
        return MISSING
    drops = d.get("filter")
    if not drops:
        return "–"
    order = ["adversary", "weak", "strong"] + sorted(set(drops) - {"adversary", "weak", "strong"})
    return ", ".join(f"{role} {drops[role][0]}/{drops[role][1]}" for role in order if role in drops)


def on_adversary(cell) -> str:
    """'4/18': honest agents' final answers that are the adversary's wrong answer."""
    d = of(cell)
    if d is None:
        return MISSING
    got = d.get("on_adversary")
    return f"{got['on_adversary']}/{got['honest']}" if got else "–"


NOTE = (f"answers: answer-bearing replies read again with the answer reader, unread (no answer found) or "
        f"ambiguous (two answers at the end); other replies: {', '.join(v for k, v in KINDS.items() if k != 'answers')}; "
        f"- : a run written before these were kept.")

__all__ = ["MARK", "of", "cell_flags", "mark", "footnote", "answers", "other_replies", "filter_drops", "on_adversary",
           "NOTE"]
