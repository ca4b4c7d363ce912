"""`byzantium plot`'s figures, drawn from hand-made report numbers with matplotlib's Agg backend and
read back from the figure objects: a corruption pattern that was not run is a gap (NaN) in the line,
bands and error bars stay within 0-100 %, bars carry their values and axis labels, and the k plot's MAJ
reference comes with its interval. (tests/test_report.py draws them from real runs.)"""
import math
from types import SimpleNamespace

import pytest

from byzantium.experiments import plot
from byzantium.experiments import report_data as data


@pytest.fixture
def figure(monkeypatch):
    """Each plot function returns its figure instead of writing and closing it."""
    monkeypatch.setattr(plot, "_save", lambda fig, path: fig)
    yield
    plot._plt().close("all")


def column(c, maj, rrmaj):
    return dict(c=c, label=f"{c}c{5 - c}t", maj_ci=maj, rrmaj_ci=rrmaj)


def test_a_pattern_not_run_is_a_gap(figure, monkeypatch):
    ci = (0.5, 0.4, 0.6)
    monkeypatch.setattr(data, "corruption_sweep", lambda cells: [dict(label="g", n=5, columns=[
        column(0, ci, ci), column(1, ci, None), column(3, ci, ci)])])  # c = 2 not run; RRMaj not at c = 1
    (ax,) = plot.plot_sweep([], "x.png").axes
    lines = {c.get_label(): c.lines[0] for c in ax.containers}
    maj, rr = (list(lines[n].get_ydata()) for n in ("MAJ", "RRMaj"))
    assert len(maj) == 4 and math.isnan(maj[2]) and not any(math.isnan(y) for y in maj[:2] + maj[3:])
    assert math.isnan(rr[1]) and math.isnan(rr[2]) and rr[0] == rr[3] == 50
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0c5t", "1c4t", "3c2t"]  # ticks only where run
    assert ax.get_ylim() == (0, 100)


def test_scaling_bands_are_clipped_to_0_100(figure, monkeypatch):
    points = [dict(m=m, mean=mean, std=0.1) for m, mean in ((1, 0.05), (2, 0.5), (3, 0.97))]
    monkeypatch.setattr(data, "scaling", lambda cells, m_max, trials: [
        dict(cell=SimpleNamespace(name="c"), method="rrmaj", points=points)])
    (ax,) = plot.plot_scaling([], "x.png").axes
    (band,) = ax.collections
    ys = [y for path in band.get_paths() for _, y in path.vertices]
    assert min(ys) == 0 and max(ys) == 100  # 5 - 10 and 97 + 10 cut at the axis' ends
    assert ax.get_ylim() == (0, 100)


def test_error_bars_stay_within_0_100():
    ys, (lo, hi) = plot._err([(0.99, 0.95, 1.02), (0.01, -0.03, 0.05), None])
    assert ys[0] + hi[0] == pytest.approx(100) and ys[1] - lo[1] == pytest.approx(0)
    assert math.isnan(ys[2])


def test_the_maj_reference_has_its_interval(figure, monkeypatch):
    monkeypatch.setattr(data, "k_ablation", lambda cells: [dict(label="s", method="rrmaj", maj=(0.9, 0.8, 1.01),
        points=[dict(k=10, ci=(0.5, 0.4, 0.6)), dict(k=100, ci=(0.7, 0.6, 0.8))])])
    (ax,) = plot.plot_k([], "x.png").axes
    (band,) = [p for p in ax.patches if p.get_label().startswith("MAJ 95% CI")]
    ys = [y for _, y in band.get_path().transformed(band.get_patch_transform()).vertices]
    assert min(ys) == pytest.approx(80) and max(ys) == pytest.approx(100)  # 101 clipped
    (line,) = [l for l in ax.get_lines() if l.get_label() == "MAJ (s)"]
    assert list(line.get_ydata()) == [90, 90]
    assert ax.get_ylim() == (0, 100) and ax.get_xlabel() and ax.get_ylabel()


def test_resilience_bars_carry_their_values(figure, monkeypatch):
    monkeypatch.setattr(data, "resilience", lambda cells: dict(structures=[
        dict(structure="linear", task="humaneval", fault="autoinject", defense=None, drop_ci=(12.0, 5.0, 19.0),
             paper_drop=10.0),
        dict(structure="flat", task="humaneval", fault="autoinject", defense="inspector", drop_ci=(-2.5, -8.0, 3.0))]))
    (ax,) = plot.plot_resilience([], "x.png").axes
    assert [t.get_text() for t in ax.texts] == ["+12.0", "-2.5"]
    assert ax.get_xlabel() and ax.get_ylabel()


def test_cost_bars_carry_their_values(figure, monkeypatch):
    side = lambda p, d, c, s: dict(prefill_tokens=p, decode_tokens=d, cached_tokens=c, seconds=s)  # noqa: E731
    monkeypatch.setattr(data, "cost_pairs", lambda cells: [dict(
        maj=SimpleNamespace(name="m"), rrmaj=SimpleNamespace(name="r"),
        sides=dict(maj=side(1200, 640, 0, 3.25), rrmaj=side(900, 700, 2_500_000, 4.0)))])
    tok, sec = plot.plot_cost([], "x.png").axes
    assert [t.get_text() for t in tok.texts] == ["1.2k", "640", "0", "900", "700", "2.5M"]
    assert [t.get_text() for t in sec.texts] == ["3.2", "4.0"]
    for ax in (tok, sec):
        assert ax.get_xlabel() and ax.get_ylabel()


def test_adversary_bars_are_signed_points_with_their_intervals(figure, monkeypatch):
    monkeypatch.setattr(data, "by_adversary", lambda cells: [dict(method="sac", topology="merg", label="math", modes={
        "fixed": {"BFTI": (0.25, -0.1, 0.5), "H-Majority": (0.75, 0.5, 0.9)},
        "adaptive": {"BFTI": (-0.2, -0.4, 0.0), "H-Majority": None}})])
    (ax,) = plot.plot_adversaries([], "x.png").axes
    assert [t.get_text() for t in ax.texts] == ["25", "75", "-20", ""]  # no H-Majority: no bar, no value
    fixed, adaptive = (c for c in ax.containers if c.get_label() in ("fixed", "adaptive"))
    assert [b.get_height() for b in fixed] == pytest.approx([25, 75]) and adaptive[0].get_height() == pytest.approx(-20)
    assert ax.get_ylim() == (-100, 100) and "SAC, merg, math" == ax.get_title()
    monkeypatch.setattr(data, "by_adversary", lambda cells: [])
    assert plot.plot_adversaries([], "x.png") is None  # one adversary mode only: nothing to compare
