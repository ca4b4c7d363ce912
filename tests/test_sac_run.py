"""`byzantium run sac|cpwbft` and its Python entry point: refusals before any model loads, the flags,
decoy adversaries, resume, and end to end on the embedded model. main() is called in-process."""
import asyncio
import json
import math
from types import SimpleNamespace

import pytest

import byzantium.backends
from byzantium.cli import main, parser
from byzantium.experiments.sac import check_config, run_experiment
from byzantium.protocols import attacks, byzantine, prompts
from byzantium.protocols.byzantine import DECOY_SYSTEM, Adversary, make_agents
from byzantium.tasks import Task, get_task, is_correct

TASK = Task("t1", "Compute 6 * 7.", None, "42", "number")


class ScriptedLLM:
    """Every solve/refine answers `answer` (with a confidence), every judgement scores `score`, a decoy
    answers `decoy`. Records the kind of every call."""
    name = "scripted"
    stats = {}

    def __init__(self, answer="42", score=0.7, decoy="41", confidence="Confidence: 0.8"):
        self.answer, self.score_value, self.decoy, self.confidence = answer, score, decoy, confidence
        self.calls, self.params = [], []

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        system = messages[0]["content"]
        kind = {prompts.JUDGE_SYSTEM: "judge", DECOY_SYSTEM: "decoy"}.get(system, "solve")
        if any("reliability score" in m["content"] for m in messages):
            kind = "refine"
        self.calls.append(kind)
        self.params.append(params)
        await asyncio.sleep(0)  # let the other coroutines of a gather start first
        if kind == "judge":
            return SimpleNamespace(text=f"Score: {self.score_value}")
        if kind == "decoy":
            return SimpleNamespace(text=self.decoy if self.decoy.startswith("I ") else
                                   f"Clearly the result is {self.decoy}.\nAnswer: {self.decoy}")
        return SimpleNamespace(text=f"Working.\nAnswer: {self.answer}\n{self.confidence}")

    async def score(self, messages, candidates, untrusted=False, tag=None):
        self.calls.append("logprob")
        await asyncio.sleep(0)
        return {"Yes": math.log(self.score_value), "No": math.log(1 - self.score_value)}


class Refusing:
    """An LLM that must not be called (a rerun with everything done)."""
    name, stats = "refusing", {}

    async def chat(self, *args, **kwargs):
        raise AssertionError("called a model for a finished instance")

    score = chat


def read(out):
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return records, json.loads((out / "summary.json").read_text())


# ------------------------------------------------------------------------------------------ adversaries

def test_attacks_reexports_the_byzantine_adversary_and_keeps_round_robin_agents():
    assert attacks.Adversary is byzantine.Adversary and attacks.wrong_answers is byzantine.wrong_answers
    agents = attacks.make_agents(object(), corrupt=1, n=3)  # round-robin's line-up is untouched
    assert [a.corrupted for a in agents] == [True, False, False]


def test_decoy_keeps_a_verified_wrong_answer():
    llm = ScriptedLLM(decoy="41")
    adv = Adversary(TASK, [("x", "7")], seed=0, agent_id=6, mode="decoy", llm=llm)
    with pytest.raises(RuntimeError, match="prepare"):
        adv.answer
    asyncio.run(adv.prepare())
    asyncio.run(adv.prepare())  # once per problem: a second call does nothing
    assert llm.calls == ["decoy"] and adv.answer == "41" and adv.message(3, 2) == "41"
    assert adv.fell_back is False and "41" in adv.text and adv.confidence == 1.0
    msgs = byzantine.decoy_prompt(TASK)
    assert msgs[0]["content"] == DECOY_SYSTEM and "Compute 6 * 7." in msgs[1]["content"]
    assert adv.record() == {"mode": "decoy", "answer": "41", "fell_back": False, "text": adv.text}


@pytest.mark.parametrize("decoy", ["42", "42.0", "I will not do that."])  # right, right, unparsable
def test_decoy_falls_back_to_the_fixed_answer(decoy):
    adv = Adversary(TASK, [("x", "7")], mode="decoy", llm=ScriptedLLM(decoy=decoy))
    asyncio.run(adv.prepare())
    assert adv.answer == "7" and adv.fell_back is True and adv.text is not None
    assert not is_correct(adv.answer, TASK.gold, TASK.kind)


def test_adversary_modes_are_checked_and_equivocate_keeps_its_old_spelling():
    with pytest.raises(ValueError, match="needs a model"):
        Adversary(TASK, ["7"], mode="decoy")
    with pytest.raises(ValueError, match="mode"):
        Adversary(TASK, ["7"], mode="liar")
    cache = [str(v) for v in range(50)]
    old, new = Adversary(TASK, cache, 1, 6, equivocate=True), Adversary(TASK, cache, 1, 6, mode="equivocate")
    assert [old.message(i) for i in range(6)] == [new.message(i) for i in range(6)]
    fixed = Adversary(TASK, cache, 1, 6)
    asyncio.run(fixed.prepare())  # nothing to do, no model needed
    assert fixed.mode == "fixed" and fixed.fell_back is None
    agents = make_agents(ScriptedLLM(), n=4, weak=0, byzantine=1, task=TASK, cache=cache, mode="decoy")
    assert agents[3].adversary.mode == "decoy" and agents[3].adversary.llm is agents[0].llm


def test_wrong_answers_of_a_choice_task_are_its_own_options():
    task = Task("c", "Pick one.", ["w", "x", "y", "z"], "B", "choice")
    assert byzantine.wrong_answers(task, ["E", "B", "(c)", "A", "c"]) == ["(c)", "A"]  # no "E", no repeat


@pytest.mark.parametrize("protocol", ["sac", "cpwbft"])
def test_decoy_runs_in_both_protocols_alongside_round_zero(protocol, tmp_path):
    llm = ScriptedLLM(answer="1", decoy="41")
    tasks = get_task("gen-arith", 2, seed=0)
    summary = run_experiment(protocol, tasks, llm, adversary="decoy", T=1, out=tmp_path, progress=False,
                             table=False, score_mode="logprob", concurrency=1)
    records, _ = read(tmp_path)
    for r in records:
        (adv,) = r["adversaries"]
        assert adv["mode"] == "decoy" and adv["id"] == 6 and adv["text"] is not None
        assert not is_correct(adv["answer"], r["gold"], r["kind"])
        assert r["rounds"][0]["agents"][6]["answer"] == adv["answer"]
    # One decoy call per problem, issued together with round 0's six solves (before any scoring).
    assert llm.calls.count("decoy") == 2 and llm.calls[:7].count("solve") == 6 and llm.calls[6] == "decoy"
    assert summary["decoy_fallbacks"] == sum(r["adversaries"][0]["fell_back"] for r in records)
    assert summary["config"]["adversary"] == "decoy"


# -------------------------------------------------------------------------------- the Python entry point

def test_summary_has_the_papers_metrics_and_failure_counts(tmp_path):
    tasks = get_task("gen-arith", 3, seed=0)
    sac = run_experiment("sac", tasks, ScriptedLLM(answer=tasks[0].gold), T=2, out=tmp_path / "sac",
                         progress=False, table=False)
    for key in ("IAA", "FAA", "BFTI", "RA", "RA-all", "H-Majority", "acc", "group_accuracy", "answer_parse_failures",
                "score_failures", "score_errors", "refine_parse_failures", "decoy_fallbacks", "engine"):
        assert key in sac, key
    assert len(sac["acc"]["strong"]) == 3 and sac["group_accuracy"]["weak"]["before"] == sac["acc"]["weak"][0]
    assert sac["IAA"] == pytest.approx(6 / 7 / 3)  # the honest agents are right on the first problem only
    assert sac["config"]["protocol"] == "sac" and sac["config"]["F"] == 3 and sac["instances"] == 3
    cp = run_experiment("cpwbft", tasks, ScriptedLLM(confidence="no confidence given"), T=2, all_rounds=True,
                        out=tmp_path / "cp", progress=False, table=False)
    assert cp["rounds_run"] == 2 and "RA-all" in cp
    assert cp["confidence_missing"] == 3 * 2 * 6  # problems x rounds x honest agents, counted not hidden


def test_resume_skips_finished_problems_and_refuses_another_config(tmp_path):
    tasks = get_task("gen-arith", 3, seed=0)
    first = run_experiment("sac", tasks, ScriptedLLM(), T=1, out=tmp_path, progress=False, table=False)
    run_experiment("sac", tasks, Refusing(), T=1, out=tmp_path, progress=False, table=False)  # all done
    records, summary = read(tmp_path)
    assert len(records) == 3 and summary["IAA"] == first["IAA"] and summary["complete"]

    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    (tmp_path / "results.jsonl").write_text("\n".join(lines[:2]) + "\n")  # as if it crashed
    llm = ScriptedLLM()
    run_experiment("sac", tasks, llm, T=1, out=tmp_path, progress=False, table=False)
    assert llm.calls.count("solve") == 6  # only the missing problem ran (6 honest agents)
    assert sorted(r["id"] for r in read(tmp_path)[0]) == sorted(t.id for t in tasks)

    with pytest.raises(ValueError, match="different configuration.*topology"):
        run_experiment("sac", tasks, ScriptedLLM(), T=1, topology="complete", out=tmp_path, progress=False)


# ------------------------------------------------------------------------------------------------- CLI

@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for a refused command")
    monkeypatch.setattr(byzantium.backends, "LLMPool", refuse)
    monkeypatch.setattr(byzantium.backends, "load_llm", refuse)


@pytest.mark.parametrize("method", ["sac", "cpwbft"])
@pytest.mark.parametrize("extra, problem", [
    (["--topology", "complete", "--agents", "4", "--weak", "0", "--f", "2"], "not 3-robust"),  # and the pair
    (["--topology", "complete", "--f", "1"], "not 1-local"),
    (["--agents", "1", "--weak", "0", "--byzantine", "0", "--f", "0"], "degree of agent 0"),
    (["--topology", "er", "--f", "4"], "5-robust"),
    (["--topology", "preferential", "--agents", "6"], "n >= 2r-1"),
    (["--weak", "5", "--byzantine", "3"], "more than --agents 7"),
    (["--agents", "0"], "--agents"),
    (["--byzantine", "7", "--weak", "0"], "no honest agent"),
    (["--weak", "-1"], "--weak"),
    (["--f", "-1"], "--f"),
    (["--rounds", "0"], "--rounds"),
    (["--limit", "0"], "--limit"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--concurrency", "0"], "--concurrency"),
    (["--task", "gen-nothing"], "gen-nothing"),
    (["--temperature", "-0.5"], "--temperature"),
    (["--graph", "no/such/graph.json"], "no/such/graph.json"),
    (["--graph", "g.json", "--topology", "complete"], "not both"),
    (["--data", "no/such/file.jsonl"], "no/such/file.jsonl"),
    (["--strong-model", "no-such-model"], "no-such-model"),
    (["--weak-model", "no-weak-model"], "no-weak-model"),
    (["--adversary", "decoy", "--adversary-model", "no-decoy-model"], "no-decoy-model"),
])
def test_bad_settings_are_refused_before_loading(method, extra, problem, no_loading, tmp_path, capsys):
    assert main(["run", method, "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_a_non_robust_graph_is_refused_with_a_violating_pair(no_loading, capsys):
    assert main(["run", "sac", "--topology", "complete", "--agents", "4", "--weak", "0", "--f", "2"]) == 2
    assert "neither {0, 1} nor {2, 3}" in capsys.readouterr().err


@pytest.mark.parametrize("extra, problem", [(["--adversary", "liar"], "--adversary"),
                                            (["--topology", "ring"], "--topology"),
                                            (["--score-mode", "vibes"], "--score-mode"),
                                            (["--backend", "vllm"], "--backend")])
def test_bad_choices_are_refused_by_the_parser(extra, problem, no_loading, capsys):
    assert main(["run", "sac", *extra]) == 2
    assert problem in capsys.readouterr().err


def test_flags_and_the_papers_defaults():
    a = parser().parse_args(["run", "sac"])
    assert (a.agents, a.weak, a.byzantine, a.F, a.rounds, a.topology, a.graph) == (7, 2, 1, 3, 6, None, None)
    assert a.temperature == 0.1 and a.seed == 0  # the paper's temperature; the topology defaults to merg
    assert (a.adversary, a.score_mode, a.backend, a.strong_model, a.weak_model) == ("fixed", "generate", "native",
                                                                                    None, None)
    argv = ["run", "cpwbft", "--agents", "9", "--weak", "3", "--byzantine", "1", "--adversary", "equivocate",
            "--f", "4", "--rounds", "2", "--topology", "preferential", "--strong-model", "a", "--weak-model", "b",
            "--backend", "hf", "--task", "gsm8k", "--data", "x.jsonl", "--limit", "5", "--seed", "3",
            "--score-mode", "logprob", "--out", "d", "--all-rounds", "--concurrency", "2", "--max-tokens", "9",
            "--no-progress", "--device", "cpu", "--dtype", "float32", "--temperature", "0.7"]
    a = parser().parse_args(argv)
    assert (a.method, a.agents, a.weak, a.byzantine, a.adversary, a.F, a.rounds, a.topology) == \
        ("cpwbft", 9, 3, 1, "equivocate", 4, 2, "preferential")
    assert (a.strong_model, a.weak_model, a.backend, a.task, a.data, a.limit, a.seed, a.score_mode, a.out) == \
        ("a", "b", "hf", "gsm8k", "x.jsonl", 5, 3, "logprob", "d")
    assert a.all_rounds and a.concurrency == 2 and a.max_tokens == 9 and a.temperature == 0.7
    with pytest.raises(SystemExit):  # --all-rounds is CP-WBFT's
        parser().parse_args(["run", "sac", "--all-rounds"])
    assert check_config("sac", 7, 2, 1, "fixed", 3, 6, "merg").number_of_edges() == 18


def test_cli_runs_resumes_and_refuses_another_config(monkeypatch, tmp_path, capsys):
    class Pool:  # the CLI's pool, on scripted models
        def __init__(self, backend, **kwargs):
            self.names = []

        def plan(self, models, shares=None):
            return {}

        def get(self, name=None):
            self.names.append(name)
            return ScriptedLLM()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(byzantium.backends, "LLMPool", Pool)
    out = tmp_path / "sac"
    argv = ["run", "sac", "--rounds", "1", "--limit", "2", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    records, summary = read(out)
    assert len(records) == 2 and summary["config"]["models"] == {"strong": "smollm2-135m", "weak": "smollm2-135m",
                                                                 "adversary": None}
    assert "Rnd 1" in capsys.readouterr().out  # the table
    monkeypatch.setattr(byzantium.backends, "LLMPool", lambda *a, **k: pytest.fail("loaded a model"))
    assert main(argv) == 0 and "already done" in capsys.readouterr().out
    assert main(argv[:-3] + ["--topology", "complete", "--out", str(out)]) == 2
    assert "different configuration" in capsys.readouterr().err


class ScriptedPool:
    """The CLI's LLMPool on scripted models."""

    def __init__(self, backend, **kwargs):
        pass

    def plan(self, models, shares=None):
        return {}

    def get(self, name=None):
        return ScriptedLLM()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


# The reference code's gamma-MERG(7) with seed 1234: degrees [6, 4, 6, 6, 6, 4, 4] (our merg(7): [5, 5, 6, 6, 6, 4, 4]).
REFERENCE_MERG7 = [[0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [1, 2], [1, 3], [1, 4], [2, 3], [2, 4], [2, 5],
                   [2, 6], [3, 4], [3, 5], [3, 6], [4, 5], [4, 6]]


@pytest.mark.parametrize("method", ["sac", "cpwbft"])
def test_graph_file_runs_exactly_that_graph(method, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(byzantium.backends, "LLMPool", ScriptedPool)
    graph = tmp_path / "merg7.json"
    graph.write_text(json.dumps(REFERENCE_MERG7))
    out = tmp_path / "out"
    assert main(["run", method, "--graph", str(graph), "--rounds", "1", "--limit", "2", "--out", str(out),
                 "--no-progress"]) == 0
    records, summary = read(out)
    for r in records:
        assert r["edges"] == REFERENCE_MERG7
        assert [sum(i in e for e in r["edges"]) for i in range(7)] == [6, 4, 6, 6, 6, 4, 4]
    c = summary["config"]
    assert c["topology"] == "edges" and c["edges"] == REFERENCE_MERG7 and c["graph"] == str(graph)
    printed = capsys.readouterr().out
    assert "graph of 18 given edges" in printed and "RA-all" in printed and "temperature 0.1" in printed


@pytest.mark.parametrize("content, extra, problem", [
    ("[[0, 1], [1, 2", [], "not JSON"),
    ('{"edges": []}', [], "list of [u, v] pairs"),
    ("[[0, 1], [1, 2]]", [], "have no edge"),
    (json.dumps(REFERENCE_MERG7 + [[6, 7]]), [], "outside 0..6"),
    (json.dumps(REFERENCE_MERG7 + [[6, 6]]), [], "self-loop"),
    (json.dumps(REFERENCE_MERG7 + [[1, 0]]), [], "given twice"),
    (json.dumps([[i, (i + 1) % 7] for i in range(7)]), [], "not 4-robust"),
    (json.dumps([[i, j] for i in range(7) for j in range(i + 1, 7)]), ["--weak", "3"], "not 3-local"),
])
def test_bad_graph_files_are_refused_before_loading(content, extra, problem, no_loading, tmp_path, capsys):
    graph = tmp_path / "g.json"
    graph.write_text(content)
    assert main(["run", "sac", "--graph", str(graph), "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err and not (tmp_path / "o").exists()


def test_one_run_seed_seeds_every_request_at_the_papers_temperature(tmp_path):
    tasks = get_task("gen-arith", 2, seed=0)

    def requests(seed, out):
        llm = ScriptedLLM()
        run_experiment("sac", tasks, llm, T=1, seed=seed, out=tmp_path / out, progress=False, table=False,
                       concurrency=1)
        return [(p.seed, p.temperature) for p in llm.params]
    first = requests(0, "a")
    assert {t for _, t in first} == {0.1} and None not in {s for s, _ in first}
    assert len({s for s, _ in first}) == len(first)  # each request its own seed
    assert requests(0, "b") == first and requests(5, "c") != first


# ------------------------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    from byzantium.backends import load_llm
    llm = load_llm(smollm2_dir, backend="native", device="cpu")
    yield llm
    llm.close()


@pytest.fixture
def shared_pool(smollm2, smollm2_dir, monkeypatch):
    """The CLI's LLMPool handing out one embedded model loaded once for this file (loading is the slow
    part on a small CPU); it checks the CLI asked for that model and does not close it."""
    from byzantium.engine.loader import resolve_model

    class Pool:
        def __init__(self, backend, **kwargs):
            assert backend == "native" and kwargs == {"device": "cpu"}

        def plan(self, models, shares=None):
            return {}

        def get(self, name=None):
            assert resolve_model(name) == resolve_model(smollm2_dir)
            return smollm2

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(byzantium.backends, "LLMPool", Pool)


def test_sac_end_to_end_on_the_embedded_model(smollm2_dir, shared_pool, tmp_path, capsys):
    out = tmp_path / "sac"
    argv = ["run", "sac", "--strong-model", str(smollm2_dir), "--agents", "7", "--weak", "2", "--byzantine", "1",
            "--f", "3", "--rounds", "2", "--topology", "merg", "--task", "gen-arith", "--limit", "3",
            "--score-mode", "logprob", "--max-tokens", "12", "--device", "cpu", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    records, summary = read(out)
    assert len(records) == 3
    for r in records:
        assert r["protocol"] == "sac" and len(r["rounds"]) == 3 and len(r["edges"]) == 18
        assert not is_correct(r["adversaries"][0]["answer"], r["gold"], r["kind"])
        for rnd in r["rounds"][1:]:
            for a in rnd["agents"][:6]:
                assert {"answer", "self_score", "scores", "kept", "dropped", "below", "text"} <= set(a)
                assert len(a["dropped"]) <= 3 and set(a["dropped"]) <= set(a["below"])
                assert set(map(int, a["scores"])) == set(a["kept"]) | set(a["dropped"])
            assert set(rnd["agents"][6]["sent"])  # what the adversary sent to each neighbour
    for key in ("IAA", "FAA", "BFTI", "RA", "H-Majority", "answer_parse_failures", "score_failures"):
        assert key in summary
    assert len(summary["acc"]["weak"]) == 3 and summary["engine"]["prefill_tokens"] > 0
    assert summary["complete"] and summary["config"]["score_mode"] == "logprob"
    assert "H-Majority" in capsys.readouterr().out


def test_cpwbft_with_a_decoy_end_to_end_on_the_embedded_model(smollm2_dir, shared_pool, tmp_path):
    out = tmp_path / "cp"
    assert main(["run", "cpwbft", "--strong-model", str(smollm2_dir), "--rounds", "2", "--all-rounds",
                 "--adversary", "decoy", "--limit", "3", "--max-tokens", "12", "--device", "cpu", "--no-progress",
                 "--out", str(out)]) == 0
    records, summary = read(out)
    assert len(records) == 3
    for r in records:
        assert r["protocol"] == "cpwbft" and r["rounds_run"] == 2 and len(r["rounds"]) == 3
        (adv,) = r["adversaries"]
        assert adv["mode"] == "decoy" and adv["text"] is not None and isinstance(adv["fell_back"], bool)
        assert not is_correct(adv["answer"], r["gold"], r["kind"])
        assert all(0.0 <= a["confidence"] <= 1.0 for rnd in r["rounds"] for a in rnd["agents"])
    assert {"RA", "RA-all", "confidence_missing", "decoy_fallbacks", "BFTI"} <= set(summary)
    assert summary["config"]["models"]["adversary"] == str(smollm2_dir)
