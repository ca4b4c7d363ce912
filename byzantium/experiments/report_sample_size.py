"""How many problems a paper's published accuracies can have come from: a percentage printed to one
decimal from k right of n is round(100 k / n, 1), so a set of printed numbers rules out every n for
which some number has no such k. The smallest n left is a lower bound on the sample behind them (any
multiple of it fits too); an average over D data sets of n problems each behaves as one of D n.

    smallest_n([99.4, 50.0])                    -> 154 (99.4 % cannot be k/128)
    implied_sizes(sweep["published"])           -> one row per table (and data set) with its smallest n
    sample_size_table(sweeps)                   -> the report's table, the claimed size checked

The Consensus Trap says 128 questions per data set; its Tables 1, 2 and 6-9 are checked against that.
"""
from .report_table import Table

CLAIMED = 128  # questions per data set, as The Consensus Trap states
LIMIT = 5000  # the largest n tried
TOLERANCE = 0.05 + 1e-9  # half the last printed decimal
CHECKED = ("Table 1", "Table 2", "Table 6", "Table 7", "Table 8", "Table 9")  # plain accuracies, k of n


def fits(value, n, tolerance=TOLERANCE) -> bool:
    """Is `value` (percent) a rounding of 100 k / n for some k in 0..n?"""
    k = round(value * n / 100)
    return any(0 <= j <= n and abs(100 * j / n - value) <= tolerance for j in (k - 1, k, k + 1))


def smallest_n(values, limit=LIMIT):
    """The smallest n that every value fits, or None up to `limit`."""
    values = list(values)
    if not values:
        raise ValueError("no published values to check")
    return next((n for n in range(1, limit + 1) if all(fits(v, n) for v in values)), None)


def misfits(values, n) -> list:
    """The values that no k of n gives."""
    return [v for v in values if not fits(v, n)]


def implied_sizes(entries, tables=CHECKED, claimed=CLAIMED) -> list:
    """Per table (its accuracies, averages apart) and per data set within it: how many numbers, the
    smallest n they fit, and the numbers that `claimed` cannot give."""
    groups = {}
    for e in entries:
        if e.get("table") not in tables or e.get("unit") != "%" or not str(e.get("metric", "")).startswith("accuracy") \
                or " at M=" in str(e.get("metric")):
            continue
        average = bool(e.get("average"))
        task = None if average else (e.get("where") or {}).get("task")
        for key in dict.fromkeys([(e["table"], average, None), (e["table"], average, task)]):
            groups.setdefault(key, []).append(float(e["value"]))
    rows = []
    for (table, average, task), values in groups.items():
        rows.append(dict(table=table, average=average, task=task, count=len(values), n=smallest_n(values),
                         misfits=misfits(values, claimed)))
    return sorted(rows, key=lambda r: (r["table"], r["average"], r["task"] is not None, str(r["task"])))


def sample_size_table(sweeps, claimed=CLAIMED):
    """The report's table for the sweeps of The Consensus Trap that carry checked tables, or None."""
    entries = [p for s in sweeps if s.get("paper") == "consensus-trap" for p in s.get("published") or []]
    rows = implied_sizes(entries, claimed=claimed)
    if not rows:
        return None
    out = []
    for r in rows:
        what = "averages" if r["average"] else (r["task"] or "all data sets")
        bad = r["misfits"]
        out.append([r["table"], what, str(r["count"]), "none up to " + str(LIMIT) if r["n"] is None else str(r["n"]),
                    "yes" if not bad else f"no: {len(bad)} cannot be ({', '.join(f'{v:g}' for v in bad[:3])}"
                                          + (", ..." if len(bad) > 3 else "") + ")"])
    return Table("Sample sizes the paper's numbers imply", ["table", "numbers", "count", "smallest n they fit",
                                                             f"fit n = {claimed}?"], out,
                 [f"a percentage printed to one decimal from k of n problems is round(100 k / n, 1); the smallest n "
                  f"every number of the row fits is a lower bound on the problems behind them (its multiples fit too). "
                  f"The paper states {claimed} questions per data set; where a row's numbers do not fit {claimed}, "
                  "they were computed over another number of problems (or trials), so our runs at "
                  f"{claimed} compare with them only approximately. Averages over D data sets of n problems fit "
                  "D n. From n = 1000 on every one-decimal number fits, so a smallest n in the hundreds says "
                  "only that the numbers did not come from a small sample."])


__all__ = ["CLAIMED", "fits", "smallest_n", "misfits", "implied_sizes", "sample_size_table"]
