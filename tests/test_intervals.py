"""Intervals honest at every size (protocols/metrics/intervals.py): n = 1, 0/n and n/n keep a width,
differences get a paired interval, the method is named, and the intervals cover what they claim to."""
import random

import pytest

from byzantium.experiments.report_table import Table, pct, pts, with_legend
from byzantium.protocols.metrics import intervals as iv


def test_one_problem_is_never_a_zero_width_interval():
    for values in ([1], [0], [0.857], [1.0]):
        t = iv.mean_ci(values)
        assert t[1] < t[2] and t[1] <= t[0] <= t[2], values
    assert iv.mean_ci([1]).method == iv.WILSON and iv.mean_ci([0.857]).method == iv.BOUNDED_WILSON
    # a value outside any known range at n = 1: no interval, said so
    t = iv.mean_ci([7.5])
    assert t[0] == 7.5 and t[1] is None and t.method == iv.TOO_SMALL
    assert pct(iv.mean_ci([7.5])) == "750.0 (n too small)"


@pytest.mark.parametrize("n", [1, 3, 10, 50])
def test_edges_0_of_n_and_n_of_n_are_wilson(n):
    zero, full = iv.mean_ci([0] * n), iv.mean_ci([1] * n)
    assert zero.method == full.method == iv.WILSON
    assert zero[:2] == (0.0, 0.0) and 0 < zero[2] < 1
    assert full[0] == full[2] == 1.0 and full[1] == pytest.approx(1 - zero[2])
    # pooled counts of a ratio at the edge (final speaker at 0/10): Wilson, not [0, 0]
    r = iv.ratio_ci([(0, 2)] * n)
    assert r.method == iv.WILSON and r[2] > 0


def test_wilson_textbook_value():
    p, lo, hi = iv.wilson(7, 10)
    assert p == 0.7 and lo == pytest.approx(0.3968, abs=1e-3) and hi == pytest.approx(0.8922, abs=1e-3)


def test_difference_of_proportions_is_paired_newcombe():
    same = iv.diff_ci({"a": 1}, {"a": 1})
    assert same.method == iv.NEWCOMBE and same[1] < 0 < same[2]  # BFTI +0.0 is not [+0.0, +79.3]
    one = iv.diff_ci({"a": 0}, {"a": 1})
    assert one[0] == 1.0 and one[1] < 0.5 and one[2] == 1.0
    # pairing matters: the same marginals, perfectly correlated, give a narrower interval than opposed
    a = {i: int(i < 10) for i in range(20)}
    together = iv.diff_ci(a, {i: int(i < 12) for i in range(20)})
    apart = iv.diff_ci(a, {i: int(i >= 8) for i in range(20)})
    assert together[0] == apart[0] == pytest.approx(0.1)
    assert together[2] - together[1] < apart[2] - apart[1]


def test_difference_of_scores_is_a_paired_bootstrap_and_bounded_when_small():
    rng = random.Random(1)
    a = {i: rng.random() for i in range(30)}
    b = {i: min(1.0, a[i] + 0.1 * rng.random()) for i in range(30)}
    t = iv.diff_ci(a, b)
    assert t.method == iv.PAIRED_BOOTSTRAP and 0 < t[1] < t[0] < t[2]
    small = iv.diff_ci({"x": 0.3}, {"x": 0.3})
    assert small.method == iv.BOUNDED_WILSON and small[1] < 0 < small[2]


def _coverage(draw, interval, truth, trials=400):
    hits = 0
    for s in range(trials):
        t = interval(draw(random.Random(s)))
        hits += t[1] <= truth <= t[2]
    return hits / trials


def test_intervals_cover_what_they_claim():
    n, p1, p2 = 25, 0.6, 0.75  # paired 0/1 outcomes with a shared component

    def pairs(rng):
        out = []
        for _ in range(n):
            u = rng.random()
            out.append((int(u < p1), int(u < p2 if rng.random() < 0.7 else rng.random() < p2)))
        return out
    cover = _coverage(pairs, lambda ps: iv.diff_ci({i: x for i, (x, _) in enumerate(ps)},
                                                   {i: y for i, (_, y) in enumerate(ps)}), p2 - p1)
    assert cover >= 0.92
    # the bounded fallback at 3 problems (scores in [0, 1]) covers at least as often as it claims
    cover = _coverage(lambda rng: [rng.betavariate(2, 2) for _ in range(3)], iv.mean_ci, 0.5)
    assert cover >= 0.95


def test_points_are_scaled_once_and_the_method_stays():
    t = iv.mean_ci([0, 0, 0])
    assert pts(t.scaled(100)) == pct(t) == "0.0 [0.0, 56.1] W"


def test_a_table_names_the_methods_its_cells_use():
    table = with_legend(Table("t", ["x", "y"], [[pct(iv.mean_ci([1, 0])), pct(iv.diff_ci({1: 0}, {1: 1}), True)],
                                                [pct(iv.mean_ci([9.0])), "–"]]))
    legend = table.notes[-1]
    assert "W = Wilson" in legend and "N = Newcombe" in legend and "n too small" in legend
    assert "B = " not in legend
