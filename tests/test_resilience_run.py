"""Resilience experiments: runs over many problems (one JSONL line each, resume, summary), the table
(drop, recovered share, means by structure), the CLI glue's refusals before any model loads, and end
to end on the embedded model: the six systems, code and math, clean, with AutoInject and with both
defences, all in one gather on one engine."""
import asyncio
import json
import math

import pytest

import byzantium.backends
from byzantium.cli import parser
from byzantium.experiments.resilience import run_resilience_experiment, run_resilience_sweep, run_resilience_sweep_async
from byzantium.experiments.resilience_command import cmd_resilience
from byzantium.experiments.resilience_table import PAPER_DROPS, format_report, resilience_report
from byzantium.protocols.resilience import SYSTEMS
from byzantium.protocols.resilience.autoinject import INJECT_SYSTEM
from byzantium.protocols.resilience.autotransform import TRANSFORM_SYSTEM
from byzantium.protocols.resilience.challenger import DUTY
from byzantium.protocols.resilience.inspector import INSPECTOR_SYSTEM
from byzantium.tasks.resilience import load_resilience_task


def parse(argv):
    """`byzantium run resilience ARGV` through the CLI's parser."""
    return parser().parse_args(["run", "resilience", *argv])


class Scripted:
    """Agents answer a math problem right ("Answer: <gold>") unless a message they received contains
    WRONG; the injector turns every chosen piece into WRONG; the Inspector revises a message with WRONG
    in it. So a fault drops the score to 0 and the Inspector recovers all of it."""
    name = "scripted"
    stats = {}

    def __init__(self, tasks, inject=None, inspect=None, block=None):
        self.golds = {t.question: t.gold for t in tasks}
        self.inject = inject or (lambda pieces: json.dumps({k: "WRONG" for k in pieces}))
        self.inspect = inspect or (lambda text: json.dumps({"decision": "unsafe", "revision": "Fixed."}
                                                           if "WRONG" in text else {"decision": "safe"}))
        self.block = block  # async (messages) -> None, awaited before an agent answers
        self.calls = []

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        await asyncio.sleep(0)  # let the other coroutines of a gather start first
        system = messages[0]["content"]
        if system == INJECT_SYSTEM:
            self.calls.append("injector")
            return Reply(self.inject(json.loads(messages[-1]["content"])))
        if system == INSPECTOR_SYSTEM:
            self.calls.append("inspector")
            return Reply(self.inspect(messages[-2]["content"]))
        if system == TRANSFORM_SYSTEM:
            self.calls.append("transformer")
            return Reply("PROFILE:\nYou slip.\nERRORS:\n- a sign")
        self.calls.append("agent")
        if self.block:
            await self.block(messages)
        gold = next(g for q, g in self.golds.items() if q in messages[1]["content"])
        seen_wrong = any("WRONG" in m["content"] for m in messages[2:])
        return Reply(f"Working.\nAnswer: {int(gold) + 1 if seen_wrong else gold}")


class Reply:
    def __init__(self, text):
        self.text = text


def arith(n=3):
    return load_resilience_task("gen-arith", limit=n)


def read(out):
    lines = (out / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], json.loads((out / "summary.json").read_text())


# ------------------------------------------------------------------------------------------ one run

def test_a_run_writes_one_line_per_problem_and_a_summary(tmp_path, capsys):
    tasks = arith(3)
    summary = run_resilience_experiment("self-collab", "gen-arith", tasks, Scripted(tasks), fault="autoinject",
                                        pe=1.0, out=tmp_path, progress=False)
    records, written = read(tmp_path)
    assert written == summary
    assert sorted(r["id"] for r in records) == sorted(t.id for t in tasks)
    for r in records:
        assert r["task"] == "gen-arith" and r["system"] == "self-collab" and r["fault"]["name"] == "autoinject"
        assert [m["sender"] for m in r["messages"]] == ["analyst", "coder", "tester"]
        assert r["messages"][1]["injected"] and r["messages"][1]["text"] == "WRONG\nWRONG"  # Pe = 1: every line
        assert r["score"] == {"kind": "number", "score": 0.0, "correct": False,
                              "detail": {"answer": str(int(r["gold"]) + 1), "gold": r["gold"]}}
    assert summary["metric"] == "accuracy" and summary["score"] == summary["accuracy"] == 0.0 and summary["n"] == 3
    assert summary["messages"] == {"messages": 9, "injected": 3, "inject_selected": 3, "inject_pieces_chosen": 6,
                                   "inject_pieces_rewritten": 6, "inject_json_failures": 0, "inspected": 0,
                                   "revised": 0, "inspector_invalid": 0, "inspector_no_revision": 0}
    assert set(summary["engine"]) >= {"prefill_tokens", "decode_tokens", "cached_tokens"}
    c = summary["config"]
    assert (c["system"], c["structure"], c["task"], c["problems"], c["fault"], c["faulty_role"]) == \
        ("self-collab", "linear", "gen-arith", 3, "autoinject", "coder")
    assert (c["pm"], c["pe"], c["error_type"], c["defense"], c["inspector_max_tokens"]) == \
        (1.0, 1.0, "semantic", "none", None)
    assert summary["complete"] and summary["instances"] == summary["total"] == 3
    assert "self-collab (linear) on gen-arith, autoinject: accuracy 0.0 over 3/3" in capsys.readouterr().out


def test_json_failures_and_invalid_inspector_replies_are_counted(tmp_path):
    tasks = arith(2)
    llm = Scripted(tasks, inject=lambda pieces: "sure, here you go", inspect=lambda text: "looks fine to me")
    summary = run_resilience_experiment("camel", "gen-arith", tasks, llm, fault="autoinject", pe=1.0, defense="both",
                                        out=tmp_path, progress=False, table=False, rounds=1)
    m = summary["messages"]
    assert m["inject_json_failures"] == m["inject_selected"] == 2 and m["injected"] == 0  # pieces left unchanged
    assert m["inspected"] == m["inspector_invalid"] == m["messages"] == 6 and m["revised"] == 0
    assert summary["score"] == 1.0  # nothing got through: every answer right
    records, _ = read(tmp_path)
    assert all(p.endswith(DUTY) for r in records for p in r["profiles"].values())  # the Challenger's duty


def test_a_line_is_on_disk_as_soon_as_its_problem_finishes(tmp_path):
    tasks = arith(2)
    slow = tasks[1].question

    async def block(messages):  # the second problem waits until the first one's line is written
        if slow in messages[1]["content"]:
            for _ in range(500):
                path = tmp_path / "results.jsonl"
                if path.exists() and tasks[0].id in path.read_text():
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the first problem's line was not written while the second ran")

    run_resilience_experiment("mad", "gen-arith", tasks, Scripted(tasks, block=block), out=tmp_path,
                              progress=False, table=False, rounds=1)
    assert [r["id"] for r in read(tmp_path)[0]] == [tasks[0].id, tasks[1].id]


def test_resume_skips_finished_problems_and_refuses_another_config(tmp_path):
    tasks = arith(3)
    run_resilience_experiment("self-collab", "gen-arith", tasks, Scripted(tasks), out=tmp_path, progress=False,
                              table=False)
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    (tmp_path / "results.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])  # a crash mid-line
    llm = Scripted(tasks)
    summary = run_resilience_experiment("self-collab", "gen-arith", tasks, llm, out=tmp_path, progress=False,
                                        table=False)
    assert llm.calls == ["agent"] * 3  # only the problem whose line was cut ran again (3 agents)
    assert sorted(r["id"] for r in read(tmp_path)[0]) == sorted(t.id for t in tasks)
    assert summary["complete"] and summary["score"] == 1.0
    with pytest.raises(ValueError, match="different configuration.*fault"):
        run_resilience_experiment("self-collab", "gen-arith", tasks, Scripted(tasks), fault="autoinject",
                                  out=tmp_path, progress=False)


# -------------------------------------------------------------------------------------- the table

def summary(system, structure, score, fault="none", defense="none", task="gen-code", complete=True, **config):
    c = dict(system=system, structure=structure, task=task, problems=10, seed=0, rounds=1, max_tokens=1024,
             model="m", fault=fault, faulty_role="x" if fault != "none" else None, pm=None, pe=None,
             error_type=None, fault_max_tokens=None, defense=defense, inspector_max_tokens=None)
    c.update(config)
    return {"config": c, "score": score, "metric": "pass@1", "complete": complete}


def runs(system, structure, clean, faulty, defended, **config):
    return [summary(system, structure, clean, **config),
            summary(system, structure, faulty, "autoinject", **config),
            summary(system, structure, defended, "autoinject", "both", **config)]


def test_drop_and_recovered_share():
    report = resilience_report(runs("self-collab", "linear", 0.8, 0.4, 0.7))
    (row,) = report["rows"]
    assert (row["clean"], row["faulty"], row["defended"]) == pytest.approx((80, 40, 70))
    assert row["drop"] == pytest.approx(40) and row["recovered"] == pytest.approx(0.75)
    assert (row["fault"], row["defense"], row["note"], row["complete"]) == ("autoinject", "both", None, True)
    assert "| self-collab | linear | gen-code | autoinject | both | 80.0 | 40.0 | 70.0 | +40.0 | 75% |" \
        in format_report(report)


def test_no_drop_leaves_the_share_undefined():
    report = resilience_report(runs("mad", "hierarchical", 0.5, 0.5, 0.6))
    (row,) = report["rows"]
    assert row["drop"] == 0 and row["recovered"] is None and "undefined" in row["note"]
    (s,) = report["structures"]
    assert s["recovered"] is None and "undefined" in s["note"]
    assert "| +0.0 | n/a (no drop) |" in format_report(report)


def test_a_negative_drop_and_missing_conditions():
    report = resilience_report(runs("camel", "flat", 0.2, 0.4, 0.3)[:2] + [summary("spp", "flat", 0.6)])
    camel, spp = report["rows"]
    assert camel["drop"] == pytest.approx(-20) and camel["defended"] is None and camel["recovered"] is None
    assert (spp["clean"], spp["faulty"], spp["drop"], spp["fault"]) == (60, None, None, None)


def test_means_by_structure():
    report = resilience_report(runs("metagpt", "linear", 0.9, 0.5, 0.8) + runs("self-collab", "linear", 0.6, 0.4, 0.4)
                               + runs("camel", "flat", 0.7, 0.6, 0.7) + runs("spp", "flat", 0.5, 0.4, 0.4)
                               + runs("mad", "hierarchical", 0.4, 0.4, 0.5))
    assert [r["system"] for r in report["rows"]] == ["metagpt", "self-collab", "camel", "spp", "mad"]
    by = {s["structure"]: s for s in report["structures"]}
    assert by["linear"]["drop"] == pytest.approx(30) and by["linear"]["clean"] == pytest.approx(75)
    # (mean defended - mean faulty) / mean drop = (60 - 45) / 30, not the mean of 0.75 and 0
    assert by["linear"]["recovered"] == pytest.approx(0.5)
    assert by["flat"]["drop"] == pytest.approx(10) and by["flat"]["recovered"] == pytest.approx(0.5)
    assert by["hierarchical"]["recovered"] is None and by["hierarchical"]["systems"] == ["mad"]
    assert {s: by[s]["paper_drop"] for s in by} == PAPER_DROPS
    text = format_report(report)
    assert "| linear | gen-code | autoinject | both | 2 | 75.0 | 45.0 | 60.0 | +30.0 | 50% | 23.7 |" in text


def test_runs_are_matched_only_on_equal_settings():
    report = resilience_report(runs("mad", "hierarchical", 0.8, 0.4, 0.6)[:1]
                               + runs("mad", "hierarchical", 0.8, 0.2, 0.6, model="other")[1:]
                               + [summary("mad", "hierarchical", 0.9, "none", "both")]
                               + runs("mad", "hierarchical", 0.8, 0.6, 0.6, task="gen-arith"))
    rows = {(r["task"], r["clean"], r["faulty"]) for r in report["rows"]}
    assert rows == {("gen-code", 80, None), ("gen-code", None, 20), ("gen-arith", 80, 60)}
    assert report["skipped"] == ["mad clean+both: a defence without a fault"]


def test_an_unfinished_run_is_marked():
    report = resilience_report(runs("spp", "flat", 0.8, 0.4, 0.7)[:2] + [summary("spp", "flat", 0.7, "autoinject",
                                                                                 "both", complete=False)])
    assert not report["rows"][0]["complete"] and "| spp * |" in format_report(report)


# ---------------------------------------------------------------------------------------------- sweep

def test_sweep_runs_every_condition_and_writes_the_table(tmp_path, capsys):
    tasks = arith(2)
    llm = Scripted(tasks)
    report = run_resilience_sweep(["self-collab", "mad"], "gen-arith", tasks, llm, fault="autoinject",
                                  defense="inspector", pe=1.0, rounds=1, out=tmp_path, progress=False)
    assert sorted(report["runs"]) == ["mad/autoinject", "mad/autoinject+inspector", "mad/clean",
                                      "self-collab/autoinject", "self-collab/autoinject+inspector",
                                      "self-collab/clean"]
    for run in report["runs"]:
        assert len(read(tmp_path / run)[0]) == 2
    rows = {r["system"]: r for r in report["rows"]}
    for r in rows.values():
        assert (r["clean"], r["faulty"], r["defended"], r["drop"], r["recovered"]) == (100, 0, 100, 100, 1.0)
    assert json.loads((tmp_path / "summary.json").read_text())["rows"] == report["rows"]
    table = (tmp_path / "summary.md").read_text()
    assert "| mad | hierarchical | gen-arith | autoinject | inspector | 100.0 | 0.0 | 100.0 | +100.0 | 100% |" in table
    assert table.strip() in capsys.readouterr().out
    assert resilience_report([tmp_path])["rows"] == report["rows"]  # the report reads a sweep's directory


def test_sweep_shares_one_autotransform_profile_per_role(tmp_path):
    tasks = arith(2)
    llm = Scripted(tasks)
    report = run_resilience_sweep(["self-collab", "camel"], "gen-arith", tasks, llm, fault="autotransform",
                                  defense="challenger", rounds=1, out=tmp_path, progress=False, table=False)
    assert llm.calls.count("transformer") == 2  # one per system, shared by its faulty and defended runs
    s = json.loads((tmp_path / "camel" / "autotransform+challenger" / "summary.json").read_text())
    assert s["autotransform"] == {"llm": 2, "fallback": 0}
    assert set(json.loads((tmp_path / "autotransform.json").read_text())) and len(report["rows"]) == 2


# ------------------------------------------------------------------------------------------------ CLI

@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for a refused command")
    monkeypatch.setattr(byzantium.backends, "LLMPool", refuse)
    monkeypatch.setattr(byzantium.backends, "load_llm", refuse)


@pytest.mark.parametrize("extra, problem", [
    (["--faulty-role", "wizard"], "faulty role 'wizard' is not one of \\['analyst', 'coder', 'tester'\\]"),
    (["--system", "all", "--faulty-role", "coder"], "system metagpt: faulty role 'coder'"),
    (["--task", "humaneval"], "--task humaneval needs its data: --data HumanEval.jsonl.gz"),
    (["--task", "ciar", "--data", "no/such/ciar.jsonl"], "no/such/ciar.jsonl"),
    (["--task", "gen-code", "--data", "x.jsonl"], "built in"),
    (["--pm", "1.5"], "--pm must be a probability"),
    (["--pe", "-0.1"], "--pe must be a probability"),
    (["--limit", "0"], "--limit"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--inspector-max-tokens", "0"], "--inspector-max-tokens"),
    (["--concurrency", "0"], "--concurrency"),
    (["--system", "mad", "--rounds", "0"], "rounds"),
    (["--sweep"], "--sweep compares"),
    (["--model", "no-such-model"], "no-such-model"),
])
def test_bad_settings_are_refused_before_loading(extra, problem, no_loading, tmp_path):
    args = parse(["--out", str(tmp_path / "o"), *extra])
    with pytest.raises(ValueError, match=problem):
        cmd_resilience(args)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag, value", [("system", "autogen"), ("task", "gsm8k"), ("fault", "flip"),
                                         ("defense", "guard"), ("error_type", "lexical")])
def test_unknown_choices_name_the_choices(flag, value, no_loading):
    with pytest.raises(SystemExit):  # the parser refuses it ...
        parse([f"--{flag.replace('_', '-')}", value])
    args = parse([])
    setattr(args, flag, value)
    with pytest.raises(ValueError, match=f"unknown --{flag.replace('_', '-')} '{value}'; choose one of"):
        cmd_resilience(args)  # ... and so does the command, for callers that build args themselves


def test_the_experiment_does_not_import_the_cli():
    # The CLI imports the experiments; the model-name check they share lives in backends.
    import ast
    from pathlib import Path

    import byzantium.experiments.resilience_command as module
    from byzantium.backends import check_model, check_models
    tree = ast.parse(Path(module.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "cli" not in imported and "byzantium.cli" not in imported
    assert module.check_models is check_models
    with pytest.raises(ValueError, match="no-such-model"):
        check_model("no-such-model")


def test_flags_and_defaults():
    a = parse([])
    assert (a.system, a.task, a.data, a.fault, a.pm, a.pe, a.error_type, a.faulty_role, a.defense) == \
        ("self-collab", "gen-code", None, "none", 1.0, 0.2, "semantic", None, "none")
    assert (a.model, a.backend, a.limit, a.seed, a.out, a.sweep, a.concurrency) == \
        (None, "native", None, 0, None, False, 64)
    a = parse(["--system", "all", "--task", "faireval", "--data", "d", "--fault", "autotransform",
               "--pm", "0.5", "--pe", "0.4", "--error-type", "syntactic", "--faulty-role", "judge",
               "--defense", "both", "--model", "m", "--backend", "hf", "--limit", "4", "--seed", "2",
               "--out", "o", "--sweep", "--rounds", "3", "--max-tokens", "9",
               "--fault-max-tokens", "8", "--inspector-max-tokens", "7", "--concurrency", "5",
               "--no-progress", "--device", "cpu", "--dtype", "float32"])
    assert (a.system, a.task, a.data, a.fault, a.pm, a.pe, a.error_type, a.faulty_role, a.defense) == \
        ("all", "faireval", "d", "autotransform", 0.5, 0.4, "syntactic", "judge", "both")
    assert (a.model, a.backend, a.limit, a.seed, a.out, a.sweep, a.rounds, a.max_tokens) == \
        ("m", "hf", 4, 2, "o", True, 3, 9)
    assert (a.fault_max_tokens, a.inspector_max_tokens, a.concurrency, a.no_progress, a.device, a.dtype) == \
        (8, 7, 5, True, "cpu", "float32")


def scripted_pool(monkeypatch, tasks):
    """The CLI's LLMPool handing out a scripted model; it checks what the CLI asked for."""
    class Pool:
        def __init__(self, backend, **kwargs):
            assert backend == "native" and kwargs == {}

        def plan(self, models, shares=None):
            return {}

        def get(self, name=None):
            assert name is None
            return Scripted(tasks)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass
    monkeypatch.setattr(byzantium.backends, "LLMPool", Pool)


def test_cli_sweep_runs_resumes_and_refuses_another_config(monkeypatch, tmp_path, capsys):
    scripted_pool(monkeypatch, arith(2))
    argv = ["--system", "all", "--sweep", "--task", "gen-arith", "--limit", "2", "--fault", "autoinject",
            "--pe", "1", "--defense", "both", "--rounds", "1", "--out", str(tmp_path), "--no-progress"]
    cmd_resilience(parse(argv))
    top = json.loads((tmp_path / "summary.json").read_text())
    assert len(top["rows"]) == 6 and len(top["runs"]) == 18 and len(top["structures"]) == 3
    assert all(r["drop"] == 100 and r["recovered"] == 1.0 for r in top["rows"])
    run = json.loads((tmp_path / "spp" / "autoinject+both" / "summary.json").read_text())
    assert run["config"]["model"] == "smollm2-135m" and run["config"]["backend"] == "native"
    # AgentVerse as the paper runs it: its solver is faulty and the critic, who saw the solver's WRONG, answers.
    for av in read(tmp_path / "agentverse" / "autoinject")[0]:
        assert av["faulty_role"] == "solver" and av["answer_role"] == "critic" and av["score"]["score"] == 0
        assert "WRONG" in next(m for m in av["messages"] if m["sender"] == "solver")["text"]
    assert "Means by structure" in capsys.readouterr().out

    monkeypatch.setattr(byzantium.backends, "LLMPool", lambda *a, **k: pytest.fail("loaded a model"))
    cmd_resilience(parse(argv))
    out = capsys.readouterr().out
    assert "already done" in out and "| agentverse | hierarchical |" in out
    with pytest.raises(ValueError, match="different configuration.*pe"):
        cmd_resilience(parse(argv + ["--pe", "0.5"]))


def test_cli_single_run_default_out(monkeypatch, tmp_path, capsys):
    scripted_pool(monkeypatch, arith(1))
    monkeypatch.chdir(tmp_path)
    cmd_resilience(parse(["--system", "mad", "--task", "gen-arith", "--limit", "1", "--fault",
                          "autoinject", "--defense", "inspector", "--rounds", "1", "--no-progress"]))
    out = tmp_path / "runs" / "resilience" / "gen-arith" / "mad" / "autoinject+inspector"
    records, s = read(out)
    assert len(records) == 1 and s["config"]["defense"] == "inspector" and s["config"]["rounds"] == 1
    assert "mad (hierarchical) on gen-arith, autoinject+inspector" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ end to end

@pytest.fixture(scope="module")
def e2e(smollm2_dir, tmp_path_factory):
    """The six systems on 2 problems, one code and one math, clean, with AutoInject (Pe 1: every faulty
    message rewritten) and with AutoInject and both defences: 36 runs in ONE gather on one engine. Replies
    are cut short: on 2 CPU cores prefill is the cost (about 20k prompt tokens here), not decoding."""
    from byzantium.backends import load_llm
    llm = load_llm(smollm2_dir, backend="native", device="cpu")
    out = tmp_path_factory.mktemp("resilience")
    short = dict(fault="autoinject", defense="both", pe=1.0, rounds=1, max_tokens=16, fault_max_tokens=24,
                 inspector_max_tokens=24, progress=False)

    async def both():
        return await asyncio.gather(*(run_resilience_sweep_async(list(SYSTEMS), name,
                                                                 load_resilience_task(name, limit=1), llm,
                                                                 out=out / name, **short)
                                      for name in ("gen-code", "gen-arith")))
    try:
        reports = dict(zip(("gen-code", "gen-arith"), asyncio.run(both())))
        stats = llm.stats
    finally:
        llm.close()
    return out, reports, stats


def test_e2e_every_run_has_its_transcripts(e2e):
    out, reports, _ = e2e
    for task, report in reports.items():
        assert len(report["runs"]) == 18
        for run in report["runs"]:
            records, s = read(out / task / run)
            assert len(records) == 1 and s["complete"] and s["instances"] == 1
            for r in records:
                assert r["messages"] and isinstance(r["output"], str)
                assert r["output"] == [m for m in r["messages"] if m["sender"] == r["answer_role"]][-1]["text"]
                assert 0.0 <= r["score"]["score"] <= 1.0 and r["score"]["kind"] == ("code" if task == "gen-code"
                                                                                      else "number")
            if task == "gen-code":
                assert s["metric"] == "pass@1" and s["pass@1"] == s["score"]
                assert all(r["score"]["detail"]["status"] in ("passed", "failed", "timeout", "crashed")
                           for r in records)
            else:
                assert s["metric"] == "accuracy" and s["accuracy"] == s["score"]


def test_e2e_faults_reach_only_the_faulty_role_and_defences_act(e2e):
    out, reports, _ = e2e
    for task in reports:
        for system in SYSTEMS:
            clean, = read(out / task / system / "clean")[0][:1]
            assert not any(m["injected"] or m["inspected"] for m in clean["messages"])
            for run in ("autoinject", "autoinject+both"):
                records, s = read(out / task / system / run)
                for r in records:
                    for m in r["messages"]:
                        assert ("injection" in m) == (m["sender"] == r["faulty_role"])
                        if "injection" in m and m["injection"]["pieces"]:  # Pe = 1: all of it chosen, one request
                            assert m["injection"]["chosen"] == list(range(m["injection"]["pieces"]))
                            assert m["injection"]["json"] in ("ok", "partial", "lines", "text", "invalid")  # how the reply was read
                assert s["messages"]["inject_selected"] == sum(m["sender"] == r["faulty_role"]
                                                               for r in records for m in r["messages"])
                defended = run.endswith("both")
                assert all(m["inspected"] == defended for r in records for m in r["messages"])
                assert all(p.endswith(DUTY) == defended for r in records for p in r["profiles"].values())
                if defended:
                    m = s["messages"]
                    assert m["inspected"] == m["messages"] and m["inspector_invalid"] <= m["inspected"]


def test_e2e_table_and_one_engine(e2e):
    out, reports, stats = e2e
    for task, report in reports.items():
        assert [r["system"] for r in report["rows"]] == ["metagpt", "self-collab", "camel", "spp", "mad",
                                                         "agentverse"]
        for r in report["rows"]:
            assert None not in (r["clean"], r["faulty"], r["defended"], r["drop"])
            assert r["recovered"] is None if r["drop"] == 0 else math.isfinite(r["recovered"])
        assert [s["structure"] for s in report["structures"]] == ["linear", "flat", "hierarchical"]
        assert (out / task / "summary.md").read_text().count("| gen-") == 6 + 3
    # Many sequences in one step: the problems of every system and condition were batched together.
    assert stats["max_batch_seqs"] > 12 and stats["decode_tokens"] > 0


# --------------------------------------------------------------------- the Inspector held to its JSON

def test_inspector_json_is_a_flag_off_by_default_and_recorded_only_when_on():
    from byzantium.experiments.resilience import build_defense, make_system, settings
    from byzantium.protocols.resilience.inspector import DECISION_SCHEMA
    assert parse([]).inspector_json is False and parse(["--inspector-json"]).inspector_json is True
    assert build_defense("inspector", 24).inspector.params.json_schema is None
    held = build_defense("both", 24, inspector_json=True).inspector.params
    assert held.json_schema == DECISION_SCHEMA and held.max_tokens == 24 and held.temperature == 0.0
    assert build_defense("challenger", inspector_json=True).inspector is None
    system = make_system("self-collab", None, None)
    assert "inspector_json" not in settings(system, "gen-arith", 1, defense="inspector")
    assert "inspector_json" not in settings(system, "gen-arith", 1, defense="challenger", inspector_json=True)
    assert settings(system, "gen-arith", 1, defense="inspector", inspector_json=True)["inspector_json"] is True


def test_inspector_json_replies_are_decisions_on_the_embedded_model(smollm2_dir, tmp_path):
    """With --inspector-json every Inspector reply starts as one of the two decisions the schema allows
    (a reply cut by its limit inside a long revision is still counted invalid)."""
    pytest.importorskip("llguidance")
    from byzantium.backends import load_llm
    llm = load_llm(smollm2_dir, backend="native", device="cpu")
    try:
        run_resilience_experiment("self-collab", "gen-arith", load_resilience_task("gen-arith", limit=2), llm,
                                  defense="inspector", rounds=1, max_tokens=16, inspector_max_tokens=40,
                                  inspector_json=True, out=tmp_path, progress=False, table=False)
    finally:
        llm.close()
    records, summary = read(tmp_path)
    replies = [m["inspection"]["reply"] for r in records for m in r["messages"] if m.get("inspected")]
    assert replies and summary["config"]["inspector_json"] is True
    for reply in replies:
        assert reply.startswith(('{"decision": "safe"}', '{"decision": "unsafe", "revision": "')), reply
        if reply.endswith("}"):
            assert json.loads(reply)["decision"] in ("safe", "unsafe")
