"""`byzantium report` and `byzantium plot` on real runs of the embedded model: a hand-written sweep
(MAJ and RRMaj across two corruption levels and two chunk sizes, SAC and CP-WBFT) and a plain
resilience run directory. Every number checked is recomputed here from the runs' own files."""
import csv
import io
import json
import re
import struct

import pytest

from byzantium.cli import main
from byzantium.experiments.plot import make_plots
from byzantium.experiments.report import build_report, render
from byzantium.tasks import is_correct

N, LIMIT, MAX_LEN = 3, 3, 16
COMMON = dict(task="gen-track", agents=N, max_len=MAX_LEN, attack="strong", temperature=0.7, seed=0, limit=LIMIT)
CT = [("maj-0c", "maj", 0, None), ("maj-2c", "maj", 2, None), ("rrmaj-0c", "rrmaj", 0, 8),
      ("rrmaj-2c", "rrmaj", 2, 8), ("rrmaj-2c-k4", "rrmaj", 2, 4)]
BYZ = dict(task="gen-arith", agents=4, weak=1, byzantine=0, F=1, rounds=2, topology="complete", limit=2)
PUBLISHED = [
    {"table": "Table 1", "method": "rrmaj", "metric": "accuracy", "value": 59.5, "unit": "%",
     "where": {"pattern": "2c1t", "chunk": 8}, "source": "CT Table 1"},
    {"table": "Table 3", "method": "sac", "metric": "BFTI", "value": 5.4, "value_max": 6.5, "unit": "%",
     "where": {"topology": "complete"}, "source": "SAC Table 3"},
    {"table": "Table 3", "method": "sac", "metric": "BFTI", "value": 1.0, "where": {"topology": "merg"},
     "source": "nowhere-to-be-seen"},
    {"table": "Table 9", "method": "rrmaj", "metric": "accuracy", "value": 33.3, "unit": "%", "average": True,
     "where": {"chunk": 8}, "source": "CT average"},
    {"table": "Table 3", "method": "rrmaj", "metric": "accuracy at M=2", "value": 44.4, "unit": "%", "average": True,
     "where": {"chunk": 8}, "source": "CT scaling average"},
]


def ct_params(c, k):
    p = dict(COMMON, corrupt=c, pattern=f"{c}c{N - c}t")
    if k is not None:
        p.update(chunk=k, trajectories=N)
    return p


@pytest.fixture(scope="module")
def runs(smollm2_dir, tmp_path_factory):
    """A sweep directory (sweep.json + one run per cell, one error row added by hand) and a plain
    resilience run directory (clean, faulty, defended)."""
    root = tmp_path_factory.mktemp("report")
    sweep, cells = root / "sweep", []
    base = ["--model", str(smollm2_dir), "--device", "cpu", "--no-progress"]
    for name, method, c, k in CT:
        argv = ["run", method, "--task", "gen-track", "--limit", str(LIMIT), "--agents", str(N), "--corrupt", str(c),
                "--max-len", str(MAX_LEN), "--out", str(sweep / name), *base]
        if k is not None:
            argv += ["--chunk", str(k), "--trajectories", str(N)]
        assert main(argv) == 0
        cells.append(dict(name=name, dir=name, method=method, params=ct_params(c, k), status="done"))
    for method in ("sac", "cpwbft"):
        argv = ["run", method, "--strong-model", str(smollm2_dir), "--agents", "4", "--weak", "1", "--byzantine", "0",
                "--f", "1", "--rounds", "2", "--topology", "complete", "--limit", "2", "--max-tokens", "12",
                "--device", "cpu", "--no-progress", "--out", str(sweep / method)]
        if method == "sac":
            argv += ["--judge-max-tokens", "8"]
        assert main(argv) == 0
        cells.append(dict(name=method, dir=method, method=method, params=BYZ, status="done"))
    cells.append(dict(name="never-ran", dir="never-ran", method="maj", params=ct_params(1, None), status="failed",
                      error="out of memory"))
    with open(sweep / "maj-0c" / "results.jsonl", "a") as f:  # an instance that raised
        f.write(json.dumps({"id": "extra", "error": {"type": "RuntimeError", "message": "x", "traceback": []}}) + "\n")
    (sweep / "sweep.json").write_text(json.dumps(dict(
        name="t", paper="consensus-trap", table="Table 1", scale="smoke", config="t.toml",
        analysis={"kind": "scaling", "m_max": 40, "trials": 20}, cells=cells, published=PUBLISHED)))
    res = root / "resilience"
    assert main(["run", "resilience", "--system", "self-collab", "--sweep", "--task", "gen-arith", "--fault",
                 "autoinject", "--defense", "both", "--limit", "2", "--rounds", "1", "--max-tokens", "16",
                 "--fault-max-tokens", "24", "--inspector-max-tokens", "24", "--model", str(smollm2_dir),
                 "--device", "cpu", "--no-progress", "--out", str(res)]) == 0
    return sweep, res


def records(path):
    rows = [json.loads(line) for line in (path / "results.jsonl").read_text().splitlines()]
    return [r for r in rows if "error" not in r], [r for r in rows if "error" in r]


def tables(dirs):
    """{title: [dict(header -> cell)]} from the csv rendering, parsed with the csv module."""
    text = render(build_report(dirs), "csv")
    out, header = {}, None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            header = None
        elif header is None:
            header = row
            assert header[0] == "table"
        else:
            assert len(row) == len(header)
            out.setdefault(row[0], []).append(dict(zip(header, row)))
    return out


def point(text):
    """The point estimate of '61.0 [52.3, 69.7] W' (or '61.0 (n too small)')."""
    return float(re.split(r" [\[(]", text)[0])


def pct(x):
    return float(f"{100 * x:.1f}")


def test_cells_table_matches_the_runs(runs):
    sweep, res = runs
    t = tables([sweep])
    assert list(t["Cells"][0]) == ["table", "cell", "method", "settings", "n", "errors",
                                   "parse failures (final / voters)", "answers", "other replies unparsed", "truncated",
                                   "metric", "ours [95% CI]", "paper", "status"]
    rows = {r["cell"]: r for r in t["Cells"]}
    assert set(rows) == {name for name, *_ in CT} | {"sac", "cpwbft", "never-ran"}
    for name, method, c, k in CT:
        good, bad = records(sweep / name)
        row = rows[name]
        assert row["n"] == f"{len(good)}/{LIMIT}" and row["errors"] == str(len(bad))
        assert point(row["ours [95% CI]"]) == pct(sum(r["correct"] for r in good) / len(good))
        voters = [v for r in good for v in r.get("agents") or r.get("trajectories")]
        assert row["parse failures (final / voters)"] == (f"{sum(r['answer'] is None for r in good)} / "
                                                          f"{sum(v['answer'] is None for v in voters)}")
        if method in ("rr", "rrmaj"):  # the share of trajectories that hit L
            ts = [t for r in good for t in (r.get("trajectories") or [r])]
            cut = sum(t["finish_reason"] == "length" for t in ts)
            assert row["truncated"] == f"{100 * cut / len(ts):.0f}% ({cut}/{len(ts)})"
        else:
            assert row["truncated"] == "–"
    assert rows["maj-0c"]["errors"] == "1"  # the row added by hand
    assert rows["never-ran"]["status"] == "failed: out of memory" and rows["never-ran"]["ours [95% CI]"] == "–"


def test_published_numbers_only_where_they_match(runs):
    sweep, _ = runs
    rows = {r["cell"]: r for r in tables([sweep])["Cells"]}
    assert [name for name, r in rows.items() if "CT Table 1" in r["paper"]] == ["rrmaj-2c"]
    assert [name for name, r in rows.items() if "SAC Table 3" in r["paper"]] == ["sac"]
    assert "5.4 to 6.5 %" in rows["sac"]["paper"]
    t = tables([sweep])
    assert not [r for title, rs in t.items() if title != "Published numbers" for r in rs
                if "nowhere-to-be-seen" in json.dumps(r)]
    matched = {r["paper"].split("(")[1].rstrip(")"): r["matched cells"] for r in t["Published numbers"]}
    assert matched == {"CT Table 1": "rrmaj-2c", "SAC Table 3": "sac", "nowhere-to-be-seen": "–"}
    (sac,) = [r for r in tables([sweep])["SAC / CP-WBFT"] if r["cell"] == "sac"]
    assert "SAC Table 3" in sac["paper"]
    sweep_rows = [r for title, rs in tables([sweep]).items() if title.startswith("Corruption sweep") for r in rs]
    (paper,) = [r for r in sweep_rows if r["method"] == "RRMaj (paper)"]
    assert "59.5 % (CT Table 1)" == paper["2c1t"] and paper["0c3t (no adversary)"] == ""
    assert not [r for r in sweep_rows if r["method"] == "MAJ (paper)"]


def test_corruption_sweep_and_delta(runs):
    sweep, _ = runs
    t = tables([sweep])
    (title,) = [k for k in t if k.startswith("Corruption sweep")]  # K=4 was run at one c only: no sweep of its own
    rows = {r["method"]: r for r in t[title]}
    acc = {}
    for name, method, c, k in CT[:4]:
        good, _ = records(sweep / name)
        acc[(method, c)] = {r["id"]: float(r["correct"]) for r in good}
    for c, col in ((0, "0c3t (no adversary)"), (2, "2c1t")):
        assert point(rows["MAJ"][col]) == pct(sum(acc[("maj", c)].values()) / LIMIT)
        assert point(rows["RRMaj"][col]) == pct(sum(acc[("rrmaj", c)].values()) / LIMIT)
        delta = sum(acc[("rrmaj", c)][i] - acc[("maj", c)][i] for i in acc[("maj", c)]) / LIMIT
        assert point(rows["Δ (points)"][col]) == pct(delta)


def test_k_scaling_final_speaker_and_cost(runs):
    sweep, _ = runs
    t = tables([sweep])
    (k_row,) = t["Chunk size K"]
    for k, name in ((4, "rrmaj-2c-k4"), (8, "rrmaj-2c")):
        good, _ = records(sweep / name)
        assert point(k_row[f"K={k}"]) == pct(sum(r["correct"] for r in good) / len(good))
    scaling = {r["cell"]: r for r in t["Test-time scaling"]}
    assert set(scaling) == {name for name, *_ in CT}
    good, _ = records(sweep / "maj-0c")  # MAJ at M=1: expected accuracy of one random agent
    one = sum(sum(is_correct(a["answer"], r["gold"], r["kind"]) for a in r["agents"]) / N for r in good) / len(good)
    assert float(scaling["maj-0c"]["M=1"].split(" ± ")[0]) == pct(one)
    assert "M=3" in scaling["maj-0c"] and "M=4" not in scaling["maj-0c"]  # pool of N=3
    speakers = {r["cell"]: r for r in t["Final speaker"]}
    assert set(speakers) == {"rrmaj-2c", "rrmaj-2c-k4"}  # 0c has no corrupted speaker
    good, _ = records(sweep / "rrmaj-2c")  # recount who spoke last (the last chunk with text) and who was right
    count = {True: [0, 0], False: [0, 0]}
    for traj in (traj for r in good for traj in r["trajectories"]):
        last = [c for c in traj["chunks"] if c["text"].strip()]
        if last:
            count[last[-1]["corrupted"]][0] += traj["correct"]
            count[last[-1]["corrupted"]][1] += 1
    for col, side in (("clean agent last", False), ("corrupted agent last", True)):
        assert f"({count[side][0]}/{count[side][1]} right)" in speakers["rrmaj-2c"][col]
    assert sum(v[1] for v in count.values()) > 0
    cost = [r for r in t["Cost parity (measured)"] if r["setting"] == "rrmaj-2c / maj-2c"]
    summaries = {m: json.loads((sweep / f"{m}-2c" / "summary.json").read_text()) for m in ("maj", "rrmaj")}
    by = {r["quantity"]: r for r in cost}
    for key, quantity in (("decode_tokens", "decode tokens"), ("prefill_tokens", "prefill tokens"),
                          ("cached_tokens", "prefix-cache hit tokens")):
        maj, rr = summaries["maj"]["engine"][key], summaries["rrmaj"]["engine"][key]
        assert by[quantity]["MAJ"] == f"{maj:,}" and by[quantity]["RRMaj"] == f"{rr:,}"
        assert float(by[quantity]["RRMaj/MAJ"]) == pytest.approx(rr / maj, abs=0.006)
    assert float(by["wall seconds"]["MAJ"].replace(",", "")) == pytest.approx(summaries["maj"]["seconds"], abs=0.06)


def test_sac_tables_match_the_transcripts(runs):
    sweep, _ = runs
    t = tables([sweep])
    rows = {r["cell"]: r for r in t["SAC / CP-WBFT"]}
    assert set(rows) == {"sac", "cpwbft"}
    for name in ("sac", "cpwbft"):
        good, _ = records(sweep / name)
        iaa = sum(sum(is_correct(a["answer"], r["gold"], r["kind"]) for a in r["rounds"][0]["agents"]) /
                  len(r["rounds"][0]["agents"]) for r in good) / len(good)
        assert point(rows[name]["IAA"]) == pct(iaa)
        per_round = [r for r in t["Weak / strong accuracy per round"] if r["cell"] == name]
        assert sorted(r["group"] for r in per_round) == ["strong", "weak"]
        weak = next(r for r in per_round if r["group"] == "weak")  # agent 3 is the weak one
        w0 = sum(is_correct(r["rounds"][0]["agents"][3]["answer"], r["gold"], r["kind"]) for r in good) / len(good)
        assert point(weak["Rnd 0"]) == pct(w0)


def test_plain_directories_several_at_once_and_resilience(runs):
    sweep, res = runs
    t = tables([sweep / "rrmaj-2c", res])  # a plain run directory and a resilience sweep's OUT
    names = [r["cell"] for r in t["Cells"]]
    assert names[0] == "rrmaj-2c/rrmaj-2c" and any(n.startswith("resilience/self-collab/") for n in names)
    row = t["Cells"][0]
    assert row["method"] == "rrmaj" and row["paper"] == ""  # no sweep.json: nothing published
    (line,) = t["Resilience by system"]
    for cond in ("clean", "faulty", "defended"):
        folder = {"clean": "clean", "faulty": "autoinject", "defended": "autoinject+both"}[cond]
        s = json.loads((res / "self-collab" / folder / "summary.json").read_text())
        assert point(line[cond]) == pct(s["score"])
    assert point(line["drop"]) == pytest.approx(point(line["clean"]) - point(line["faulty"]), abs=0.11)
    assert t["Resilience by structure"][0]["paper drop"] == "23.7"
    # An AutoInject run that rewrote nothing is said to be inert (its drop is 0 by construction).
    rewrote = json.loads((res / "self-collab" / "autoinject" / "summary.json").read_text())["messages"][
        "inject_pieces_rewritten"]
    (table,) = [x for x in build_report([res]) if x.title == "Resilience by system"]
    assert any("AutoInject rewrote no piece" in n for n in table.notes) == (rewrote == 0)


def test_every_interval_holds_its_point_and_formats_parse(runs):
    sweep, res = runs
    built = build_report([sweep, res])
    md = render(built, "md")
    found = re.findall(r"([+-]?\d+\.\d) \[([+-]?\d+\.\d), ([+-]?\d+\.\d)\]", md)
    assert len(found) > 40
    for p, lo, hi in found:
        assert float(lo) <= float(p) <= float(hi)
    assert md.count("### ") == len(built)
    for block in md.split("### ")[1:]:
        lines = [line for line in block.splitlines() if line.startswith("|")]
        assert len({line.count(" | ") for line in lines if "---" not in line}) == 1  # no ragged rows
    tex = render(built, "tex")
    assert tex.count(r"\begin{tabular}") == tex.count(r"\end{tabular}") == len(built)
    for t, block in zip(built, tex.split(r"\begin{tabular}")[1:]):
        rows = [line for line in block.split(r"\end{tabular}")[0].splitlines() if line.endswith("\\\\")]
        assert len(rows) == len(t.rows) + 1
        assert all(len(re.findall(r"(?<!\\)&", line)) == len(t.header) - 1 for line in rows)
    assert not [line for line in tex.splitlines() if not line.startswith("%") and re.search(r"(?<!\\)%", line)]


def test_cli_report_and_errors(runs, tmp_path, capsys):
    sweep, _ = runs
    out = tmp_path / "r.csv"
    assert main(["report", str(sweep), "--format", "csv", "--out", str(out)]) == 0
    assert list(csv.reader(io.StringIO(out.read_text())))[0][:3] == ["table", "cell", "method"]
    assert main(["report", str(sweep), "--format", "xls"]) == 2
    assert "--format 'xls'" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in ("report", "plot"):
        assert main([command, str(empty)]) == 2
        assert str(empty) in capsys.readouterr().err


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plots_only_what_the_data_supports(runs, tmp_path, capsys):
    sweep, res = runs
    written = make_plots([sweep, res], tmp_path / "all")
    assert sorted(p.name for p in written) == ["cost.png", "k.png", "resilience.png", "rounds.png", "scaling.png",
                                               "sweep.png"]
    for path in written:
        w, h = png_size(path)
        assert 300 < w < 3000 and 200 < h < 2000 and path.stat().st_size > 5000
    assert main(["plot", str(sweep / "sac"), "--out", str(tmp_path / "sac")]) == 0
    assert sorted(p.name for p in (tmp_path / "sac").iterdir()) == ["rounds.png"]  # no K, no sweep, no cost
    assert "rounds.png" in capsys.readouterr().out


def test_an_analysis_kind_other_than_scaling_leaves_the_curves_out(runs, tmp_path):
    sweep, _ = runs
    data = json.loads((sweep / "sweep.json").read_text())
    data["analysis"] = {"kind": "corruption"}
    for cell in data["cells"]:
        cell["dir"] = str(sweep / cell["dir"])  # an absolute dir is taken as it is
    other = tmp_path / "corruption"
    other.mkdir()
    (other / "sweep.json").write_text(json.dumps(data))
    titles = set(tables([other]))
    assert "Test-time scaling" not in titles and any(t.startswith("Corruption sweep") for t in titles)
    assert "scaling.png" not in [p.name for p in make_plots([other], tmp_path / "plots")]


def test_bootstrap_intervals():
    from byzantium.protocols.metrics.intervals import diff_ci, mean_ci, mean_of_means_ci, ratio_ci
    values = [1, 0, 1, 1, 0, 1, 0, 1]
    point, lo, hi = mean_ci(values)
    assert point == 5 / 8 and lo < point < hi and mean_ci(values) == (point, lo, hi)  # seeded: reproducible
    assert mean_ci([1, 1, 1])[:2] == (1.0, pytest.approx(0.4385, abs=1e-4)) and mean_ci([]) == (None, None, None)
    assert ratio_ci([(3, 5), (1, 5)])[0] == pytest.approx(0.4)
    assert diff_ci({"a": 0, "b": 1, "c": 1}, {"a": 1, "b": 1, "d": 0})[0] == pytest.approx(0.5)  # a, b only
    point, lo, hi = mean_of_means_ci([[1, 1], [0, 0, 0, 0]])
    assert point == 0.5 and lo < point < hi  # not the pooled 1/3; no resample varies: still a width
    point, lo, hi = mean_of_means_ci([[1, 0, 1], [0, 0, 1, 1]])
    assert lo <= point <= hi and point == pytest.approx((2 / 3 + 1 / 2) / 2)


def test_accuracy_interval_keeps_its_width_at_0_of_n_and_n_of_n():
    from byzantium.protocols.metrics.intervals import mean_ci, wilson
    lo0, hi0 = mean_ci([0, 0, 0])[1:]
    lo1, hi1 = mean_ci([1, 1, 1])[1:]
    assert lo0 == 0.0 and 0.5 < hi0 < 0.6  # Wilson at 0/3: [0, 56.1 %], not [0, 0]
    assert hi1 == 1.0 and abs(lo1 - (1 - hi0)) < 1e-12  # symmetric at n/n
    p, lo, hi = wilson(7, 10)
    assert p == 0.7 and abs(lo - 0.3968) < 1e-3 and abs(hi - 0.8922) < 1e-3  # the textbook values


def test_a_cell_whose_mechanism_did_nothing_says_so():
    from byzantium.experiments import report_data
    from byzantium.experiments.report_cells import Cell
    zero = Cell("maj-0", "maj", {}, records=[{"id": str(i), "correct": False, "answer": "3", "agents": []} for i in range(3)])
    unparsed = Cell("maj-u", "maj", {}, records=[{"id": "a", "correct": False, "answer": None, "agents": []}])
    fine = Cell("maj-ok", "maj", {}, records=[{"id": "a", "correct": True, "answer": "4", "agents": []}])
    rows = {r["cell"].name: r for r in report_data.cell_rows([zero, unparsed, fine])}
    assert rows["maj-0"]["idle"].startswith("0 on every problem")
    assert rows["maj-u"]["idle"] == "every final answer unparsed" and rows["maj-ok"]["idle"] is None


def test_published_averages_sit_beside_our_average_of_the_same_cells(runs):
    sweep, _ = runs
    t = tables([sweep])
    everywhere = [r for title, rs in t.items() if title != "Published averages" for r in rs]
    assert not [r for r in everywhere if "CT average" in json.dumps(r) or "CT scaling average" in json.dumps(r)]
    rows = {r["metric"]: r for r in t["Published averages"]}
    acc = [sum(r["correct"] for r in records(sweep / name)[0]) / len(records(sweep / name)[0])
           for name in ("rrmaj-0c", "rrmaj-2c")]
    assert rows["accuracy"]["cells run"] == "2/2" and point(rows["accuracy"]["ours"]) == pct(sum(acc) / 2)
    assert "33.3 % (CT average)" == rows["accuracy"]["paper"]
    scaling = {r["cell"]: r for r in t["Test-time scaling"]}
    at2 = [float(scaling[name]["M=2"].split(" ±")[0]) for name in ("rrmaj-0c", "rrmaj-2c")]
    assert abs(float(rows["accuracy at M=2"]["ours"]) - sum(at2) / 2) < 0.051


def test_two_backbones_and_two_error_types_stay_apart_in_the_resilience_table():
    """At paper scale mas_main runs GPT-3.5 and GPT-4o, semantic and syntactic AutoInject, on one system
    and task: each row's clean, faulty and drop come from its own runs, not from whichever came last."""
    from types import SimpleNamespace

    from byzantium.experiments import report_data

    def cell(model, fault, error_type, scores):
        config = dict(system="camel", structure="flat", task="gen-code", model=model, fault=fault, defense="none",
                      faulty_role="assistant", pm=1.0, pe=0.2, error_type=error_type, fault_max_tokens=None,
                      inspector_max_tokens=None, seed=0)
        summary = dict(config=config, score=sum(scores) / len(scores), complete=True, metric="pass@1")
        records = [{"id": f"p{i}", "score": {"score": s}} for i, s in enumerate(scores)]
        return SimpleNamespace(method="resilience", summary=summary, records=records, sweep=None)

    cells = [cell("gpt-3.5", "none", "semantic", [1, 1, 1, 1]), cell("gpt-4o", "none", "semantic", [1, 1, 0, 0]),
             cell("gpt-3.5", "autoinject", "semantic", [0, 1, 1, 1]),
             cell("gpt-3.5", "autoinject", "syntactic", [0, 0, 1, 1]),
             cell("gpt-4o", "autoinject", "semantic", [0, 1, 0, 0])]
    rows = {(r["model"], r["fault_settings"]["error_type"]): r for r in report_data.resilience(cells)["rows"]}
    assert {k: (r["clean_ci"][0], r["faulty_ci"][0]) for k, r in rows.items()} == {
        ("gpt-3.5", "semantic"): (100.0, 75.0), ("gpt-3.5", "syntactic"): (100.0, 50.0),
        ("gpt-4o", "semantic"): (50.0, 25.0)}
    assert rows[("gpt-3.5", "syntactic")]["drop_ci"][0] == pytest.approx(50.0)
