"""A report's table and how its numbers are written (report.py and the tables of report_frontier.py and
report_scale.py): percent with its 95 % interval, points, plain counts."""
from dataclasses import dataclass, field


@dataclass
class Table:
    title: str
    header: list
    rows: list
    notes: list = field(default_factory=list)


def pct(t, signed=False):
    """(point, lo, hi) in [0, 1] (or points when already scaled) as '61.0 [52.3, 69.7]'."""
    if t is None or t[0] is None:
        return "–"
    f = "{:+.1f}" if signed else "{:.1f}"
    return f"{f.format(100 * t[0])} [{f.format(100 * t[1])}, {f.format(100 * t[2])}]"


def pts(t, signed=False):
    """The same for numbers already in points."""
    return "–" if t is None or t[0] is None else pct(tuple(x / 100 for x in t), signed)


def num(x, spec="{:,.0f}"):
    return "–" if x is None else spec.format(x)
