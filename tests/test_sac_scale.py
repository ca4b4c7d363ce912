"""SAC at scale (issue 36 item 2): --f auto from each graph's certificate, the check used per size, graphs
of 101 agents built and checked quickly, line-ups as shares of n, a round's judgements issued together and
the share batched measured from the engine's step records (a scripted backend, then the embedded model),
the report's table and plot on run directories over n, the experiment file's dry run."""
import asyncio
import json
import math
import random
import time
from types import SimpleNamespace

import networkx as nx
import pytest

import byzantium.backends
from byzantium.cli import main
from byzantium.experiments import report_scale
from byzantium.experiments.plot import make_plots
from byzantium.experiments.report import build_report
from byzantium.experiments.report_cells import load_cells
from byzantium.experiments.sac import (certificate, check_config, default_robustness, line_up, run_experiment,
                                       scoring_batches, step_marks)
from byzantium.protocols import graphs
from byzantium.protocols.byzantine import make_agents
from byzantium.protocols.metrics.sac import judgements
from byzantium.protocols.sac import run_sac
from byzantium.sweep.cells import ConfigError, _check_type
from byzantium.tasks import get_task


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for a refused command")
    monkeypatch.setattr(byzantium.backends, "LLMPool", refuse)


# ------------------------------------------------------------------------------------------- F auto

@pytest.mark.parametrize("topology, n, r, F", [("merg", 7, None, 3), ("merg", 31, None, 15), ("complete", 9, None, 4),
                                               ("preferential", 15, 5, 4), ("preferential", 31, None, 12)])
def test_f_auto_is_the_certified_robustness_minus_one(topology, n, r, F):
    G = check_config("sac", n, 1, 1, "fixed", "auto", 2, topology, 0, "logprob", None, r)
    assert G.graph["F"] == F and G.graph["robustness"]["r"] == F + 1
    assert F < min(d for _, d in G.degree())  # no agent can drop every neighbour
    if n <= graphs.EXACT_MAX_NODES:  # the proof agrees with the exact search
        assert graphs.robustness(G, "exact") == F + 1


def test_f_auto_on_an_erdos_renyi_sample_is_its_exact_robustness():
    G = check_config("sac", 15, 1, 1, "fixed", "auto", 2, "er", 3, "logprob", None, None)
    assert G.graph["robustness"]["check"] == "exact"
    assert G.graph["F"] == graphs.robustness(G) - 1 >= 1
    # built for default_robustness(15) = 6 without resampling until 6-robust: the sample's own robustness counts
    assert default_robustness(15) == 6 and min(d for _, d in G.degree()) >= 6


def test_a_numeric_f_beyond_the_certificate_is_refused_with_a_pair_or_the_bound():
    with pytest.raises(ValueError, match="not 5-robust"):
        check_config("sac", 7, 1, 1, "fixed", 4, 2, "merg", 0, "logprob")
    edges = [list(e) for e in graphs.erdos_renyi(101, 41, 0, verify=False).edges]  # past the MILP: a bound only
    with pytest.raises(ValueError, match="could not be certified 30-robust.*--f auto"):
        check_config("sac", 101, 1, 1, "fixed", 29, 2, "edges", 0, "logprob", edges)


def test_shares_of_n_make_counts_and_are_checked_f_local():
    assert line_up(7, 0.1, 0.1) == (1, 1) and line_up(101, 0.1, 0.1) == (10, 10) and line_up(7, 2, 1) == (2, 1)
    assert line_up(15, 0.1, 0.1) == (2, 2)  # 1.5 rounds half up
    G = check_config("sac", 31, 0.1, 0.1, "fixed", "auto", 2, "merg", 0, "logprob")
    assert (G.graph["weak"], G.graph["byzantine"]) == (3, 3)
    with pytest.raises(ValueError, match="not 2-local"):  # 3 of 7 faulty on preferential(7, 3): F = 2
        check_config("sac", 7, 0.286, 0.143, "fixed", "auto", 2, "preferential", 0, "logprob")
    with pytest.raises(ValueError, match="between 0 and 1"):
        line_up(7, 1.5, 0)


def test_the_cli_and_the_sweep_take_auto_and_shares(no_loading, capsys):
    assert main(["run", "sac", "--f", "x", "--out", "/nonexistent/o"]) == 2
    assert "neither an integer nor 'auto'" in capsys.readouterr().err
    assert main(["run", "sac", "--weak", "abc", "--out", "/nonexistent/o"]) == 2
    assert "neither a count nor a share" in capsys.readouterr().err

    def fail(key, message):
        raise ConfigError(f"{key}: {message}")
    for key, value in (("F", "auto"), ("weak", 0.1), ("byzantine", 0.25), ("robustness", 0.4), ("robustness", 5)):
        _check_type(key, value, fail)
    for key, value in (("F", "most"), ("weak", 1.5), ("robustness", "x")):
        with pytest.raises(ConfigError):
            _check_type(key, value, fail)


# -------------------------------------------------------------------------------- checks per size

def test_the_check_used_per_size():
    assert certificate("merg", graphs.merg(101))["check"].startswith("proof")  # odd n: Lee & Panagou
    assert certificate("merg", graphs.merg(12))["check"] == "exact"  # even n: our construction, searched
    even = certificate("merg", graphs.merg(22))
    assert (even["r"], even["check"], even["exact"]) == (11, "milp", True)
    big = graphs.erdos_renyi(51, 21, 0, verify=False)
    cert = certificate("er", big)
    assert cert["check"] == "bound" and not cert["exact"] and cert["r"] == graphs.lower_bound(big) >= 2


def test_lower_bound_never_exceeds_the_robustness():
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(4, 13)
        G = nx.gnp_random_graph(n, rng.uniform(0.3, 0.9), seed=rng.randint(0, 10**6))
        assert graphs.lower_bound(G) <= graphs.robustness(G, "exact")
    assert graphs.lower_bound(graphs.complete(40)) == 20  # tight on K_n: ceil(n/2)


def test_the_milps_cuts_keep_its_optimum():
    rng = random.Random(1)
    for _ in range(8):
        G = nx.gnp_random_graph(14, rng.uniform(0.3, 0.8), seed=rng.randint(0, 10**6))
        assert graphs.robustness(G, "milp") == graphs.robustness(G, "exact")


def test_graphs_of_101_agents_are_built_and_checked_quickly():
    start = time.perf_counter()
    for topology in ("merg", "preferential", "er"):
        G = check_config("sac", 101, 0.1, 0.1, "fixed", "auto", 2, topology, 1234, "logprob", None, 0.4)
        assert G.number_of_nodes() == 101 and G.graph["F"] >= 10
        assert graphs.f_local(G, set(range(81, 101)), G.graph["F"])
    assert time.perf_counter() - start < 30  # proofs, the lower bound and f_local: no MILP at n = 101


# --------------------------------------------------------------------------------------- batching

class Batching:
    """A scripted model that takes requests the way the engine does: every call that arrives before its
    next step (one pass of the event loop after the first) joins that step. Records each step's calls."""
    name, stats = "batching", {}

    def __init__(self):
        self.waiting, self.steps, self.flushing = [], [], None

    async def _request(self, kind, result):
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((kind, future, result))
        if self.flushing is None:
            self.flushing = asyncio.ensure_future(self._step())
        return await future

    async def _step(self):
        await asyncio.sleep(0)  # what AsyncEngine._run does before each step
        batch, self.waiting, self.flushing = self.waiting, [], None
        self.steps.append([kind for kind, _, _ in batch])
        for _, future, result in batch:
            future.set_result(result)

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        kind = "refine" if any("reliability score" in m["content"] for m in messages) else "solve"
        return await self._request(kind, SimpleNamespace(text="Answer: 42"))

    async def score(self, messages, candidates, untrusted=False, tag=None):
        return await self._request("judge", {"Yes": math.log(0.6), "No": math.log(0.4)})


def test_a_rounds_judgements_reach_the_model_in_one_step():
    task = get_task("gen-arith", 1, seed=0)[0]
    llm = Batching()
    G = graphs.merg(15)
    agents = make_agents(llm, n=15, weak=0, byzantine=2, task=task, cache=[("x", "7")], seed=0)
    record = asyncio.run(run_sac(task, G, agents, F=7, T=2, score_mode="logprob"))
    honest = [a.id for a in agents if a.honest]
    per_round = sum(G.degree(i) for i in honest)  # every honest agent judges every neighbour
    judge_steps = [s.count("judge") for s in llm.steps if "judge" in s]
    for rnd in record["rounds"][1:]:
        assert sum(len(a["scores"]) for a in rnd["agents"] if "scores" in a) == per_round
    # round 0's self-scores together, then each round's n x degree judgements all in one step
    assert judge_steps[0] == len(honest) and judge_steps.count(per_round) == 2


def test_scoring_batches_reads_the_step_records_since_the_marks():
    def step(i, *score_rows):
        return SimpleNamespace(step=i, tags=[["score", "prefill", k, 0, 0] for k in score_rows]
                               + [["refine", "decode", 3, 3, 0]])
    llm = SimpleNamespace(engine=SimpleNamespace(step_records=SimpleNamespace(records=[step(1, 5)])))
    marks = step_marks([llm])
    llm.engine.step_records.records += [step(2, 4), step(3, 1), step(4), step(5, 2, 3)]
    b = scoring_batches([llm, llm], marks)  # one engine, named twice: counted once
    assert b == {"rows": 10, "batched_rows": 9, "passes": 3, "share_batched": 0.9, "mean_rows_per_pass": 10 / 3,
                 "max_rows_per_pass": 5}
    assert scoring_batches([SimpleNamespace(name="server")]) is None  # no step records: not measured


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    from byzantium.backends import load_llm
    llm = load_llm(smollm2_dir, backend="native", num_blocks=2048)
    yield llm
    llm.close()


def test_share_batched_end_to_end_on_the_embedded_model(smollm2, tmp_path, capsys):
    from byzantium.backends import SamplingParams
    tasks = get_task("gen-sum", 1, seed=0)
    summary = run_experiment("sac", tasks, smollm2, n=9, weak=0.12, byzantine=0.12, F="auto", T=1, topology="merg",
                             score_mode="logprob", solve_params=SamplingParams(max_tokens=8, temperature=0.1),
                             out=tmp_path / "sac", progress=False)
    g, b = summary["graph"], summary["scoring_batches"]
    assert g["F"] == 4 and g["check"].startswith("proof") and summary["config"]["F_auto"]
    assert summary["config"]["weak"] == 1 and summary["config"]["shares"] == {"weak": 0.12, "byzantine": 0.12}
    record = json.loads((tmp_path / "sac" / "results.jsonl").read_text().splitlines()[0])
    judged = sum(len(a["scores"]) for a in record["rounds"][1]["agents"] if "scores" in a)
    assert judged == 2 * g["edges"] - sum(8 in e for e in record["edges"])  # the adversary (agent 8) judges none
    # Every judge prompt is counted; identical ones (one answer, one model) ride on one row in one pass, the
    # rest share passes with other scoring rows: most prompts shared a pass.
    assert b["prompts"] == judgements(record) > judged and b["riders"] == b["prompts"] - b["rows"] > 0
    assert b["share_prompts_batched"] == (b["riders"] + b["batched_rows"]) / b["prompts"] > 0.5
    out = capsys.readouterr().out
    assert "(auto)" in out and "judge prompts" in out


# --------------------------------------------------------------------------------- report and plot

def test_report_and_plot_over_n(tmp_path):
    """Runs at n = 7 and 9 side by side: the table and the plot, registered in report and plot."""
    from test_sac_run import ScriptedLLM
    task = [t for t in get_task("gen-arith", 3, seed=0)]
    dirs = []
    for n in (7, 9):
        out = tmp_path / f"n{n}"
        run_experiment("sac", task, ScriptedLLM(answer="0"), n=n, weak=1, byzantine=1, F="auto", T=1,
                       topology="merg", score_mode="logprob", out=out, progress=False, table=False)
        dirs.append(str(out))
    cells, _ = load_cells(dirs)
    rows = report_scale.scale_rows(cells)
    assert [(r["n"], r["F"]) for r in rows] == [(7, 3), (9, 4)]
    assert all(r["problems"] == 3 and r["batched"] is None for r in rows)  # a scripted backend keeps no steps
    table = next(t for t in build_report(dirs) if t.title == "SAC at scale")
    assert [row[3] for row in table.rows] == ["7", "9"] and "proof" in table.rows[0][5]
    written = make_plots(dirs, tmp_path / "plots")
    assert tmp_path / "plots" / "sac_scale.png" in written
    assert report_scale.scale_rows(cells[:1]) == []  # one n: nothing to scale over


def test_the_experiment_file_dry_runs_at_both_scales(tmp_path, capsys):
    (tmp_path / "math500.jsonl").write_text(json.dumps({"problem": "1+1?", "solution": "\\boxed{2}"}) + "\n")
    assert main(["sweep", "sac_scale", "--out", str(tmp_path / "s"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "9 cells" in out and "sac-gen-sum-N31-er" in out
    assert main(["sweep", "sac_scale", "--out", str(tmp_path / "p"), "--scale", "paper", "--data-root",
                 str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "30 cells" in out and "N101-preferential" in out and "Qwen3-4B" in out
