"""Confidence intervals over problems, one place for every report: which method fits the numbers, and
an interval that says which method gave it.

    mean_ci([1, 0, 1, 1])                 -> Interval(0.75, lo, hi, "Wilson")   accuracy over problems
    ratio_ci([(3, 5), (1, 5)])            -> sum(num) / sum(den), problems resampled
    diff_ci({"q1": 1, ...}, {"q1": 0})    -> b - a, paired over the problems both have
    mean_of_means_ci([[...], [...]])      -> the mean of groups' means, each group resampled on its own

An Interval is the tuple (point, lo, hi) with `.method`; lo and hi are None when no honest interval can
be given ("n too small"). The method, 95 % by default:

- a proportion (every value 0 or 1): the Wilson score interval, which keeps its width at n = 1, 0/n
  and n/n, where every resample is the same and a percentile interval would have no width;
- a difference of two proportions on the same problems: Newcombe's interval for paired proportions
  (his method 10: Wilson intervals of both sides combined with their correlation);
- other values: the percentile bootstrap over problems (paired: the problem's two values move
  together; answers nested in a problem move together too). Below MIN_BOOTSTRAP problems, or where
  every resample gives the same number, a percentile interval is too narrow to trust; values known to
  lie in a bounded range (scores in [0, 1], differences of them in [-1, 1]) then get the Wilson interval
  of their mean rescaled to [0, 1] (no variable in that range varies more than a 0/1 one of the same
  mean, so it is the wider one), anything else no interval.
Seeds are fixed, so a report is the same every time.
"""
import math
from statistics import NormalDist

import numpy as np

BOOT = 2000  # resamples
SEED = 0
LEVEL = 0.95
# Below this many problems a percentile bootstrap covers the truth less often than it claims.
MIN_BOOTSTRAP = 10

WILSON = "Wilson"
NEWCOMBE = "Newcombe paired"
BOOTSTRAP = "bootstrap"
PAIRED_BOOTSTRAP = "paired bootstrap"
STRATIFIED_BOOTSTRAP = "stratified bootstrap"
BOUNDED_WILSON = "Wilson, bounded mean"
TOO_SMALL = "n too small"
# How a report writes each method beside an interval, and what its legend says of it.
TAGS = {WILSON: "W", NEWCOMBE: "N", BOOTSTRAP: "B", PAIRED_BOOTSTRAP: "PB", STRATIFIED_BOOTSTRAP: "SB",
        BOUNDED_WILSON: "WB"}
LEGEND = {
    WILSON: "Wilson score interval of a proportion",
    NEWCOMBE: "Newcombe's interval for a difference of paired proportions (method 10)",
    BOOTSTRAP: f"percentile bootstrap over problems ({BOOT} resamples)",
    PAIRED_BOOTSTRAP: f"percentile bootstrap over problems, both sides of a problem resampled together ({BOOT} "
                      "resamples)",
    STRATIFIED_BOOTSTRAP: f"percentile bootstrap, each group's problems resampled on their own ({BOOT} resamples)",
    BOUNDED_WILSON: f"Wilson interval of a bounded mean (too few problems, under {MIN_BOOTSTRAP}, or no spread for "
                    "a bootstrap; wider than needed, never narrower)",
}


class Interval(tuple):
    """(point, lo, hi), with the method that gave lo and hi (None bounds: no honest interval)."""

    def __new__(cls, point, lo, hi, method):
        self = super().__new__(cls, (point, lo, hi))
        self.method = method
        return self

    def scaled(self, factor):
        """The same interval in other units (e.g. points: 100)."""
        return Interval(*(None if x is None else factor * x for x in self), self.method)


NONE = Interval(None, None, None, None)


def _z(level):
    return NormalDist().inv_cdf((1 + level) / 2)


def _wilson_bounds(p, n, level):
    z = _z(level)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if p <= 0 else max(0.0, centre - half)), (1.0 if p >= 1 else min(1.0, centre + half))


def wilson(k, n, level=LEVEL):
    """Interval(k/n, lo, hi): the Wilson score interval of a proportion (k may be fractional: a bounded mean)."""
    k, n = float(k), float(n)
    if n <= 0:
        return NONE
    p = k / n
    return Interval(p, *_wilson_bounds(p, n, level), WILSON)


def _bounded(mean, n, low, high, level):
    """The Wilson interval of a mean of n values within [low, high], rescaled to [0, 1] and back."""
    width = high - low
    lo, hi = _wilson_bounds(min(1.0, max(0.0, (mean - low) / width)), n, level)
    return Interval(mean, low + width * lo, low + width * hi, BOUNDED_WILSON)


def _range(values):
    """(low, high): the range the values are known to lie in ([0, 1] or [-1, 1]), or None."""
    if all(0.0 <= v <= 1.0 for v in values):
        return 0.0, 1.0
    if all(-1.0 <= v <= 1.0 for v in values):
        return -1.0, 1.0
    return None


def _percentile(stats, level):
    return np.nanquantile(stats, [(1 - level) / 2, (1 + level) / 2])


def _indices(n, seed, boot):
    return np.random.default_rng(seed).integers(0, n, size=(boot, n))


def _trusted(n, lo, hi):
    return n >= MIN_BOOTSTRAP and hi > lo


def ratio_ci(pairs, seed=SEED, boot=BOOT, level=LEVEL):
    """sum(num)/sum(den) over per-problem (num, den) pairs, problems resampled; counts (0 <= num <= den,
    e.g. right trajectories of a problem's) fall back to the Wilson interval of the pooled counts."""
    pairs = [(float(a), float(b)) for a, b in pairs]
    if not pairs:
        return NONE
    num, den = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    if den.sum() == 0:
        return NONE
    point = float(num.sum() / den.sum())
    idx = _indices(len(pairs), seed, boot)
    d = den[idx].sum(1)
    stats = np.divide(num[idx].sum(1), d, out=np.full(boot, np.nan), where=d > 0)
    lo, hi = _percentile(stats, level)
    if _trusted(len(pairs), lo, hi):
        return Interval(point, float(lo), float(hi), BOOTSTRAP)
    if all(b == 1 and 0 <= a <= 1 for a, b in pairs):  # per-problem scores in [0, 1]
        return _bounded(point, len(pairs), 0.0, 1.0, level)
    if all(a.is_integer() and b.is_integer() and 0 <= a <= b for a, b in pairs):  # counts: pooled
        return wilson(num.sum(), den.sum(), level)
    return Interval(point, None, None, TOO_SMALL)


def mean_ci(values, seed=SEED, boot=BOOT, level=LEVEL):
    """The mean of per-problem values (None values are left out): Wilson when every value is 0 or 1."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return NONE
    if all(v in (0.0, 1.0) for v in values):
        return wilson(sum(values), len(values), level)
    return _mean_of(values, seed, boot, level, BOOTSTRAP)


def _mean_of(values, seed, boot, level, method, bounds=None):
    """The bootstrap interval of a mean, or the bounded fallback within `bounds` (default: the range
    the values show, _range), or none (see the module's notes)."""
    a = np.array(values)
    point = float(a.mean())
    lo, hi = _percentile(a[_indices(len(a), seed, boot)].mean(1), level)
    if _trusted(len(a), lo, hi):
        return Interval(point, float(lo), float(hi), method)
    bounds = bounds or _range(values)
    return _bounded(point, len(a), *bounds, level) if bounds else Interval(point, None, None, TOO_SMALL)


def newcombe_paired(x, y, level=LEVEL):
    """Interval of mean(y) - mean(x) for 0/1 values paired by position (Newcombe 1998, method 10)."""
    n = len(x)
    if n == 0:
        return NONE
    both = sum(1 for a, b in zip(x, y) if a and b)
    only_y = sum(1 for a, b in zip(x, y) if b and not a)
    only_x = sum(1 for a, b in zip(x, y) if a and not b)
    neither = n - both - only_y - only_x
    p1, p2 = (both + only_y) / n, (both + only_x) / n  # difference p1 - p2 = mean(y) - mean(x)
    l1, u1 = _wilson_bounds(p1, n, level)
    l2, u2 = _wilson_bounds(p2, n, level)
    margins = (both + only_y) * (only_x + neither) * (both + only_x) * (only_y + neither)
    phi = (both * neither - only_y * only_x) / math.sqrt(margins) if margins else 0.0
    lower = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    upper = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    d = p1 - p2
    return Interval(d, max(-1.0, d - lower), min(1.0, d + upper), NEWCOMBE)


def diff_ci(a, b, seed=SEED, boot=BOOT, level=LEVEL):
    """mean of b - a, paired over the problem ids both dicts have (id -> value): Newcombe for 0/1
    values, else a paired bootstrap (the bounded fallback below MIN_BOOTSTRAP problems)."""
    common = [k for k in a if k in b and a[k] is not None and b[k] is not None]
    if not common:
        return NONE
    x, y = [float(a[k]) for k in common], [float(b[k]) for k in common]
    if all(v in (0.0, 1.0) for v in x + y):
        return newcombe_paired(x, y, level)
    within = all(0.0 <= v <= 1.0 for v in x + y)  # scores in [0, 1]: their differences in [-1, 1]
    return _mean_of([q - p for p, q in zip(x, y)], seed, boot, level, PAIRED_BOOTSTRAP,
                    (-1.0, 1.0) if within else None)


def mean_of_means_ci(groups, seed=SEED, boot=BOOT, level=LEVEL):
    """The mean of the groups' means, each group's problems resampled on their own (stratified), e.g.
    an average over data sets whose problems differ; the bounded fallback as mean_ci's, with n the
    problems of all groups."""
    groups = [[float(v) for v in g if v is not None] for g in groups]
    groups = [g for g in groups if g]
    if not groups:
        return NONE
    stats = np.zeros(boot)
    for i, g in enumerate(groups):
        stats += np.array(g)[_indices(len(g), seed + i, boot)].mean(1)
    stats /= len(groups)
    point = float(np.mean([np.mean(g) for g in groups]))
    lo, hi = _percentile(stats, level)
    n = sum(len(g) for g in groups)
    if _trusted(n, lo, hi):
        return Interval(point, float(lo), float(hi), STRATIFIED_BOOTSTRAP)
    bounds = _range([v for g in groups for v in g])
    return _bounded(point, n, *bounds, level) if bounds else Interval(point, None, None, TOO_SMALL)


def methods_note(methods) -> str | None:
    """The legend of the interval methods a table uses: 'intervals (95 %): W Wilson ...; B ...'."""
    used = [m for m in TAGS if m in set(methods)]
    parts = [f"{TAGS[m]} = {LEGEND[m]}" for m in used]
    if TOO_SMALL in set(methods):
        parts.append(f'"{TOO_SMALL}": no interval could be given honestly')
    return f"intervals ({100 * LEVEL:.0f} %): " + "; ".join(parts) + "." if parts else None
