"""Bootstrap confidence intervals over problems, with a fixed seed so that a report is reproducible.

    mean_ci([1, 0, 1, 1])                 -> (0.75, lo, hi)     accuracy over problems
    ratio_ci([(3, 5), (1, 5)])            -> (0.4, lo, hi)      sum(num) / sum(den), problems resampled
    diff_ci({"q1": 1, ...}, {"q1": 0})    -> (Δ, lo, hi)        paired over the problems both have

Problems are the unit that is resampled (with replacement); answers nested in a problem (MAJ votes,
RRMaj trajectories) move together. Percentile intervals, 95 % by default, except for a mean of 0/1
values (an accuracy): there the Wilson score interval, which keeps its width at 0/n and n/n, where every
resample is the same and a percentile interval would be [0, 0].
"""
import math

import numpy as np

BOOT = 2000  # resamples
SEED = 0
LEVEL = 0.95


def _indices(n, seed, boot):
    return np.random.default_rng(seed).integers(0, n, size=(boot, n))


def ratio_ci(pairs, seed=SEED, boot=BOOT, level=LEVEL):
    """(point, lo, hi) of sum(num)/sum(den) over per-problem (num, den) pairs; Nones when empty or den 0."""
    pairs = [(float(a), float(b)) for a, b in pairs]
    num, den = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    if not pairs or den.sum() == 0:
        return None, None, None
    idx = _indices(len(pairs), seed, boot)
    d = den[idx].sum(1)
    stats = np.divide(num[idx].sum(1), d, out=np.full(boot, np.nan), where=d > 0)
    lo, hi = np.nanquantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(num.sum() / den.sum()), float(lo), float(hi)


def wilson(k, n, level=LEVEL):
    """(k/n, lo, hi): the Wilson score interval of a proportion."""
    from statistics import NormalDist
    z = NormalDist().inv_cdf((1 + level) / 2)
    p = k / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def mean_ci(values, seed=SEED, boot=BOOT, level=LEVEL):
    """(mean, lo, hi) of per-problem values (None values are left out); Wilson when every value is 0 or 1."""
    values = [float(v) for v in values if v is not None]
    if values and all(v in (0.0, 1.0) for v in values):
        return wilson(sum(values), len(values), level)
    return ratio_ci([(v, 1) for v in values if v is not None], seed, boot, level)


def diff_ci(a, b, seed=SEED, boot=BOOT, level=LEVEL):
    """(mean of b - a, lo, hi), paired over the problem ids both dicts have (id -> value)."""
    common = [k for k in a if k in b and a[k] is not None and b[k] is not None]
    return ratio_ci([(b[k] - a[k], 1) for k in common], seed, boot, level)  # differences: not a proportion


def mean_of_means_ci(groups, seed=SEED, boot=BOOT, level=LEVEL):
    """(mean of the groups' means, lo, hi): each group's problems resampled on their own (stratified),
    e.g. an average over datasets whose problems differ."""
    groups = [[float(v) for v in g if v is not None] for g in groups]
    groups = [g for g in groups if g]
    if not groups:
        return None, None, None
    stats = np.zeros(boot)
    for i, g in enumerate(groups):
        stats += np.array(g)[_indices(len(g), seed + i, boot)].mean(1)
    stats /= len(groups)
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(np.mean([np.mean(g) for g in groups])), float(lo), float(hi)
