"""A report's table and how its numbers are written (report.py and the tables of report_frontier.py and
report_scale.py): percent with its 95 % interval, points, plain counts."""
import re
from dataclasses import dataclass, field

from ..protocols.metrics.intervals import TAGS, TOO_SMALL, Interval, methods_note


@dataclass
class Table:
    title: str
    header: list
    rows: list
    notes: list = field(default_factory=list)


def pct(t, signed=False):
    """(point, lo, hi) in [0, 1] as '61.0 [52.3, 69.7] W': percent, the interval's method tagged
    (intervals.TAGS; the table's legend says what each tag is), '61.0 (n too small)' where no interval
    could be given honestly."""
    if t is None or t[0] is None:
        return "–"
    f = "{:+.1f}" if signed else "{:.1f}"
    if t[1] is None:
        return f"{f.format(100 * t[0])} ({TOO_SMALL})"
    tag = TAGS.get(getattr(t, "method", None))
    return f"{f.format(100 * t[0])} [{f.format(100 * t[1])}, {f.format(100 * t[2])}]" + (f" {tag}" if tag else "")


def pts(t, signed=False):
    """The same for numbers already in points (scaled back once, here)."""
    if t is None or t[0] is None:
        return "–"
    return pct(t.scaled(0.01) if isinstance(t, Interval) else tuple(None if x is None else x / 100 for x in t), signed)


def methods_in(table) -> list:
    """The interval methods a table's cells name (by their tags), for its legend."""
    names = {tag: method for method, tag in TAGS.items()}
    found = {names[m] for row in table.rows for v in row for m in re.findall(r"\] ([A-Z]{1,2})\b", str(v)) if m in names}
    if any(TOO_SMALL in str(v) for row in table.rows for v in row):
        found.add(TOO_SMALL)
    return sorted(found)


def with_legend(table):
    """The table with a note naming the interval methods its cells use (none when it has no interval)."""
    note = methods_note(methods_in(table))
    if note and note not in table.notes:
        table.notes.append(note)
    return table


def num(x, spec="{:,.0f}"):
    return "–" if x is None else spec.format(x)
