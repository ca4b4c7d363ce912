"""One scale for all protocols (frontier.toml, report_frontier.py): the shipped file gives every method
the same problems and the same budgets at both scales; a tiny frontier sweep run for real on the
embedded model (MAJ, RRMaj, SAC, CP-WBFT at budgets 0 and 1 of 3) gives the report's table and the plot,
every number of which is recomputed here from the runs' own files."""
import json
import math
import re

import pytest

from byzantium.cli import main
from byzantium.experiments import figures, plot
from byzantium.experiments import report_frontier as rf
from byzantium.experiments.plot import make_plots
from byzantium.experiments.report import build_report
from byzantium.protocols.metrics.sac import instance_metrics
from byzantium.sweep.config import load_sweep
from byzantium.tasks import is_correct

RR_METHODS, SAC_METHODS = ("maj", "rrmaj"), ("sac", "cpwbft")


def flag(cell, name):
    return cell.argv[cell.argv.index(name) + 1] if name in cell.argv else None


@pytest.mark.parametrize("scale, budgets, n", [("smoke", {0, 1, 2}, 5), ("paper", {0, 1, 2, 3}, 7)])
def test_every_method_gets_the_same_problems_and_budgets(scale, budgets, n):
    sweep = load_sweep("frontier", scale, check_files=False)
    per_budget = {}
    for cell in sweep.cells:
        b = int(flag(cell, "--corrupt" if cell.method in RR_METHODS else "--byzantine"))
        per_budget.setdefault((b, tuple(cell.models)), set()).add(cell.method)
        assert int(flag(cell, "--agents")) == n and cell.params["agents"] == n
        # the same problems: one task, one data file, one draw (or one generator seed)
        assert (flag(cell, "--task"), flag(cell, "--data"), flag(cell, "--sample"), flag(cell, "--seed")) == \
            (flag(sweep.cells[0], "--task"), flag(sweep.cells[0], "--data"), flag(sweep.cells[0], "--sample"),
             flag(sweep.cells[0], "--seed"))
        if cell.method in SAC_METHODS:  # the budget is the only fault, and the graph check passed
            assert flag(cell, "--weak") == "0" and flag(cell, "--topology") == "complete"
            assert b <= int(flag(cell, "--f"))
        else:
            assert "--byzantine" not in cell.argv and "--f" not in cell.argv
    assert {b for b, _ in per_budget} == budgets
    assert all(methods == set(RR_METHODS + SAC_METHODS) for methods in per_budget.values()), per_budget
    if scale == "paper":  # every model runs every method
        assert {m for _, models in per_budget for m in models} == {"Qwen/Qwen3-4B", "Qwen/Qwen3-30B-A3B"}


def test_the_dry_run_lists_every_cell(tmp_path, capsys, monkeypatch):
    import byzantium.backends
    monkeypatch.setattr(byzantium.backends, "LLMPool", lambda *a, **k: pytest.fail("loaded a model"))
    assert main(["sweep", "frontier", "--dry-run", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    listed = {line.split()[0] for line in out.splitlines() if re.match(r"(maj|rrmaj|sac|cpwbft)-", line)}
    assert listed == {c.name for c in load_sweep("frontier").cells} and len(listed) == 12
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------- a real frontier sweep

TINY = """
paper = ["consensus-trap", "sac"]
[analysis]
kind = "frontier"
[run]
agents = 3
F = 1
weak = 0
topology = "complete"
task = "gen-sum"
limit = 2
max_len = 8
max_tokens = 8
chunk = 4
rounds = 1
score_mode = "logprob"
[axes]
budget = [0, 1]
[[cells]]
method = "maj"
[[cells]]
method = "rrmaj"
[[cells]]
method = "sac"
[[cells]]
method = "cpwbft"
"""


@pytest.fixture(scope="module")
def swept(smollm2_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("frontier")
    (root / "f.toml").write_text(TINY)
    out = root / "out"
    assert main(["sweep", str(root / "f.toml"), "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    return out


def read(run):
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    return rows, json.loads((run / "summary.json").read_text())


def expected(method, row):
    """The system's answer, right or not, from the record itself."""
    if method == "sac":
        return instance_metrics(row)["RA-all"]  # all agents' plurality (adversary included)
    if method == "cpwbft":
        return float(is_correct(row["decision"], row["gold"], row["kind"]))
    return float(bool(row["correct"]))


def test_the_budget_reaches_every_run(swept):
    sweep = json.loads((swept / "sweep.json").read_text())
    assert len(sweep["cells"]) == 8 and all(c["status"] == "done" for c in sweep["cells"])
    for cell in sweep["cells"]:
        _, summary = read(swept / cell["dir"])
        c = summary["config"]
        b = c["corrupt"] if cell["method"] in RR_METHODS else c["byzantine"]
        assert c["agents"] == 3 and b in (0, 1)
        assert b == (cell["params"]["corrupt"] if cell["method"] in RR_METHODS else cell["params"]["byzantine"])
        if cell["method"] in SAC_METHODS:
            assert c["weak"] == 0


def test_the_table_is_the_runs(swept):
    (table,) = [t for t in build_report([swept]) if t.title == "Accuracy / cost frontier under attack"]
    rows = [dict(zip(table.header, r)) for r in table.rows]
    assert len(rows) == 8
    sweep = json.loads((swept / "sweep.json").read_text())
    by_name = {c["name"]: c for c in sweep["cells"]}
    assert [r["corrupted"] for r in rows] == ["0 of 3"] * 4 + ["1 of 3"] * 4  # ordered by budget
    truth = {}  # cell -> (accuracy, {cost: per problem}) from its files
    for r in rows:
        cell = by_name[r["cell"]]
        records, summary = read(swept / cell["dir"])
        acc = sum(expected(cell["method"], x) for x in records) / len(records)
        cost = summary["cost"]
        truth[r["cell"]] = acc, {k: cost[k] / cost["instances"] for k in ("decode_tokens", "prefill_tokens", "seconds")}
        assert r["method"] == rf.NAMES[cell["method"]] and r["n"] == str(len(records)) == "2"
        assert float(r["accuracy [95% CI]"].split(" [")[0]) == pytest.approx(100 * acc, abs=0.05)
        assert r["decode tok/problem"] == f"{truth[r['cell']][1]['decode_tokens']:,.0f}"
        assert r["prefill tok/problem"] == f"{truth[r['cell']][1]['prefill_tokens']:,.0f}"
        assert r["seconds/problem"] == f"{truth[r['cell']][1]['seconds']:,.2f}"
        assert cost["decode_tokens"] > 0 and cost["seconds"] > 0
    # on the frontier under a cost: no other cell of its budget at least as accurate for at most that cost
    for r in rows:
        acc, costs = truth[r["cell"]]
        others = [truth[q["cell"]] for q in rows if q is not r and q["corrupted"] == r["corrupted"]]
        for key, word in (("decode_tokens", "decode"), ("prefill_tokens", "prefill"), ("seconds", "seconds")):
            beaten = any(c[key] <= costs[key] and a >= acc and (c[key] < costs[key] or a > acc) for a, c in others)
            assert (word in r["on the frontier"]) == (not beaten), (r, word)


def test_the_plot_has_a_row_per_budget_and_each_point_is_a_run(swept, monkeypatch):
    (path,) = [p for p in make_plots([swept], swept / "plots") if p.name == "frontier.png"]
    assert path.stat().st_size > 0
    monkeypatch.setattr(figures, "save", lambda fig, path: fig)
    fig = rf.plot_frontier(build_cells(swept), "x.png")
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2 * len(rf.COSTS)
    points = {p["cell"].name: p for p in rf.frontier(build_cells(swept))}
    for i, ax in enumerate(axes):
        key = rf.COSTS[i % len(rf.COSTS)][0]
        assert ax.get_xscale() == "log" and ax.get_ylim() == (0, 100)
        budget = 0 if i < len(rf.COSTS) else 1
        assert ax.get_title().endswith(f"{budget} of 3 corrupted")
        drawn = sorted((c.lines[0].get_xdata()[0], c.lines[0].get_ydata()[0]) for c in ax.containers)
        want = sorted(((p["cost"][key]), 100 * p["accuracy"][0]) for p in points.values()
                      if p["budget"] == (budget, 3) and p["cost"][key])
        assert len(drawn) == len(want) == 4
        for (x, y), (wx, wy) in zip(drawn, want):
            assert x == pytest.approx(wx) and y == pytest.approx(wy)
        for c in ax.containers:  # 95% intervals within the axis, around the point
            (bar,) = c.lines[2]
            (lo, hi) = bar.get_segments()[0][:, 1]
            assert 0 <= lo <= c.lines[0].get_ydata()[0] <= hi <= 100 and not math.isnan(lo)
    plot._plt().close(fig)


def build_cells(swept):
    from byzantium.experiments.report_cells import load_cells
    return load_cells([swept])[0]


def test_plain_run_directories_meet_only_where_two_methods_share_a_budget(swept, tmp_path):
    """Without a sweep.json, a run is on the frontier only beside another method at its setting and budget."""
    import shutil
    sweep = json.loads((swept / "sweep.json").read_text())
    names = {c["dir"] for c in sweep["cells"] if c["method"] in ("maj", "sac")}
    names.add(next(c["dir"] for c in sweep["cells"] if c["method"] == "rrmaj" and c["params"]["corrupt"] == 1))
    for name in names:
        shutil.copytree(swept / name, tmp_path / name)
    points = rf.frontier(build_cells(tmp_path))
    got = sorted((p["method"], p["budget"]) for p in points)
    assert got == sorted([("maj", (0, 3)), ("sac", (0, 3)), ("maj", (1, 3)), ("sac", (1, 3)), ("rrmaj", (1, 3))])
    only = tmp_path / "alone"
    shutil.copytree(swept / next(iter(sorted(names))), only / "run")
    assert rf.frontier(build_cells(only)) == []  # one method: nothing to compare
