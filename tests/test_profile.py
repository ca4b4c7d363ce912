"""Accounting on the real engine and `byzantium profile`: a run that mixes prefill and decode sums
exactly, the protocols tag their requests and the tags reach the stats, the decode rate reported for a round-robin workload agrees with
pure-decode runs at the same batch sizes, and `profile run rr|sac` writes a Chrome trace with both
phase tracks, a profile.json and a PNG."""
import asyncio
import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

import byzantium.backends
from byzantium import Engine, SamplingParams
from byzantium.backends import load_llm
from byzantium.cli import main
from byzantium.protocols.attacks import make_agents
from byzantium.protocols.round_robin import round_robin
from byzantium.protocols.rr_prompts import TEMPERATURE, agent_messages
from byzantium.protocols.byzantine import make_agents as sac_agents
from byzantium.protocols.cpwbft import run_cpwbft
from byzantium.protocols.graphs import complete
from byzantium.protocols.resilience import build_system, kind_of, make_defense, make_fault, run_system
from byzantium.protocols.resilience.autoinject import INJECT_SYSTEM
from byzantium.protocols.resilience.autotransform import TRANSFORM_SYSTEM
from byzantium.protocols.resilience.inspector import INSPECTOR_SYSTEM
from byzantium.protocols.voting import majority_vote
from byzantium.tasks import get_task
from conftest import random_prompts
from test_resilience_systems import Scripted, task as resilience_task
from test_stats import check_exact


@pytest.mark.parametrize("profile", [False, True])
def test_a_run_mixing_prefill_and_decode_sums_exactly_by_phase_and_tag(tiny_llama, profile):
    _, path = tiny_llama
    # A 24-token budget: the long prompt is prefilled in chunks while the short requests decode.
    engine = Engine(path, num_blocks=64, max_batch_tokens=24, profile=profile)
    engine.add_requests(random_prompts([8, 8], seed=1), SamplingParams(max_tokens=12, ignore_eos=True), tag="short")
    engine.add_requests(random_prompts([70], seed=2), SamplingParams(max_tokens=4, ignore_eos=True), tag="long")
    while engine.has_work():
        engine.step()
    stats = engine.step_records
    mixed = [r for r in stats.records if r.phase == "mixed"]
    assert len(mixed) >= 2
    assert {r.attribution for r in mixed} <= ({"measured"} if profile else {"model", "token share"})
    check_exact(stats)
    tokens = {(t["tag"], t["phase"]): t["tokens"] for t in engine.stats["by_tag"]}
    assert tokens == {("short", "prefill"): 16, ("short", "decode"): 2 * 11,
                      ("long", "prefill"): 70, ("long", "decode"): 3}
    s = engine.stats
    assert s["prefill_tok_per_s"] == pytest.approx(s["prefill_tokens"] / s["prefill_seconds"])
    assert s["decode_tok_per_s"] == pytest.approx(s["decode_tokens"] / s["decode_seconds"])


@pytest.fixture
def one_thread():
    # Two threads on a shared 2-core machine turn every contention into a stalled matmul; one thread
    # keeps step times steady enough to compare two runs' rates.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_round_robin_decode_rate_agrees_with_pure_decode_at_the_same_batch_sizes(smollm2_dir, one_thread):
    """RR trajectories with K = 2 and K = 3 (turn switches in different steps, so many steps mix one
    trajectory's append prefill with another's decode), profiling on, against pure-decode runs at the
    batch sizes the RR steps decoded at, with the same prompts, sampling and length. The runs alternate
    on one engine (so they share the machine's load) and are told apart by tag."""
    g, length = 4, 24
    # No speculation: drafts would add rows to some decode steps and end trajectories in different steps.
    llm = load_llm(smollm2_dir, backend="native", num_blocks=512, profile=True, num_speculative_tokens=0)
    engine = llm.engine.engine
    engine.eos_token_ids.clear()  # every trajectory runs to L (the set the append loop reads): the same workload every round
    tasks = get_task("gen-arith", 2 * g, seed=0)
    prompts = [llm.render_chat(agent_messages(t)) for t in tasks]

    async def rr(seed):
        agents = make_agents(llm, 1, 3)
        await asyncio.gather(*(round_robin(t, agents, k=2 + i % 2, max_len=length, seed=seed * 100 + i)
                               for i, t in enumerate(tasks)))

    async def pure(d):
        params = [SamplingParams(max_tokens=length, temperature=TEMPERATURE, seed=i, ignore_eos=True) for i in range(d)]
        await llm.engine.generate(prompts[:d], params, tag=f"pure{d}")

    ratios = []
    try:
        for attempt in range(3):  # the best of up to three measurements
            llm.reset_stats()
            for r in range(3):
                asyncio.run(rr(attempt * 10 + r))
                for d in (g, 2 * g):
                    asyncio.run(pure(d))
            records = engine.step_records.records
            turn = [r for r in records if any(t[0] == "turn" for t in r.tags)]
            mixed = [r for r in turn if r.phase == "mixed"]
            assert all(r.attribution == "measured" for r in mixed)
            batches = Counter(r.decode_tokens for r in turn if r.decode_tokens)
            assert set(batches) <= {g, 2 * g} and sum(r.decode_tokens for r in mixed) >= 0.2 * sum(
                d * n for d, n in batches.items())  # a good part of the decode tokens come from mixed steps
            step_ns = {}
            for d in batches:
                steps = [r.ns for r in records if r.phase == "decode" and r.tags[0][0] == f"pure{d}"]
                step_ns[d] = sum(steps) / len(steps)
            expected = sum(d * n for d, n in batches.items()) / sum(step_ns[d] * n for d, n in batches.items()) * 1e9
            reported = next(t for t in llm.stats["by_tag"] if t["tag"] == "turn" and t["phase"] == "decode")
            ratios.append(reported["tok_per_s"] / expected)
            print(f"RR decode {reported['tok_per_s']:.1f} tok/s reported, {expected:.1f} tok/s from pure decode "
                  f"at batch sizes {dict(batches)}: ratio {ratios[-1]:.3f}")
            if abs(ratios[-1] - 1) <= 0.10:
                break
    finally:
        llm.close()
    assert min(abs(r - 1) for r in ratios) <= 0.10, ratios


class TagRecorder:
    """Any prompt gets the same reply; every call's tag is recorded, with the system prompt it came with."""
    name, tokenizer = "tags", None

    def __init__(self, text):
        self.text, self.calls = text, []

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        self.calls.append((messages[0]["content"], tag))
        await asyncio.sleep(0)
        return SimpleNamespace(text=self.text, token_ids=[1], finish_reason="stop")


def test_protocols_tag_their_requests():
    task = get_task("gen-arith", 1, seed=0)[0]
    llm = TagRecorder("Answer: 7\nConfidence: 0.9")
    asyncio.run(majority_vote(task, make_agents(llm, 1, 3), max_tokens=8))
    assert [tag for _, tag in llm.calls] == ["vote"] * 3
    llm.calls.clear()
    agents = sac_agents(llm, n=4, weak=0, byzantine=1, task=task, mode="decoy")
    asyncio.run(run_cpwbft(task, complete(4), agents, T=1))
    assert Counter(tag for _, tag in llm.calls) == {"solve": 3, "decoy": 1}

    system = build_system("metagpt")
    scripted = Scripted(system, kind_of(resilience_task()))
    tags = []

    async def chat(messages, params=None, untrusted=False, tag=None):
        tags.append((messages[0]["content"], tag))
        return await Scripted.chat(scripted, messages, params, untrusted, tag)
    scripted.chat = chat
    for fault, defense in (("autotransform", "inspector"), ("autoinject", "none")):
        asyncio.run(run_system(system, resilience_task(), scripted, fault=make_fault(fault, pm=1.0, pe=1.0),
                               defense=make_defense(defense)))
    by_system = {INJECT_SYSTEM: "inject", TRANSFORM_SYSTEM: "transform", INSPECTOR_SYSTEM: "inspect"}
    assert {tag for _, tag in tags} == {"agent", "inject", "transform", "inspect"}
    assert all(tag == by_system.get(prompt, "agent") for prompt, tag in tags)


def check_trace(path):
    """Valid Chrome-trace JSON (object form) with a steps track and non-empty prefill and decode tracks."""
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert isinstance(events, list) and all(isinstance(e, dict) and "ph" in e and "name" in e for e in events)
    for e in events:
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and "pid" in e and "tid" in e
        if e["ph"] == "C":
            assert isinstance(e["ts"], (int, float)) and all(isinstance(v, (int, float)) for v in e["args"].values())
    tracks = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(tracks) == {"steps", "prefill", "decode"}
    slices = Counter(e["tid"] for e in events if e["ph"] == "X")
    assert all(slices[tracks[name]] > 0 for name in tracks)
    # requests as flows: each starts once, ends once, later, and every point lies inside a step slice
    flows = {}
    for e in events:
        if e["ph"] in "stf" and e.get("cat") == "request":
            flows.setdefault(e["id"], []).append(e)
    assert flows
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X" and e["tid"] == tracks["steps"]]
    for points in flows.values():
        assert [e["ph"] for e in points] == ["s", *["t"] * (len(points) - 2), "f"]
        assert all(a["ts"] < b["ts"] for a, b in zip(points, points[1:]))
        assert all(any(lo <= e["ts"] <= hi for lo, hi in steps) for e in points)
    return trace


def check_profile(out, capsys, tags):
    check_trace(out / "trace.json")
    assert (out / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "profile.json").read_text())
    assert len(data["steps"]) == data["summary"]["steps"] > 0 and data["engine"]["profile"] is True
    assert sum(s["decode_tokens"] for s in data["steps"]) == data["summary"]["decode_tokens"]
    assert tags <= {t["tag"] for t in data["summary"]["by_tag"]}
    printed = capsys.readouterr().out
    assert "tok/s" in printed and "share" in printed and all(tag in printed for tag in tags)
    return data


def test_profile_run_rr_writes_trace_json_and_png(smollm2_dir, tmp_path, capsys):
    out = tmp_path / "rr"
    argv = ["profile", "run", "rrmaj", "--model", str(smollm2_dir), "--limit", "2", "--agents", "3", "--corrupt", "1",
            "--chunk", "4", "--max-len", "16", "--out", str(out), "--device", "cpu", "--no-progress",
            "--torch-profiler", "--torch-profiler-steps", "2"]
    assert main(argv) == 0
    check_profile(out, capsys, {"turn"})
    assert "traceEvents" in json.loads((out / "torch_trace.json").read_text())
    assert (out / "results.jsonl").is_file()  # the run itself, as `byzantium run` writes it
    assert main(argv) == 0  # everything done: nothing ran, and it says so
    assert "no model ran" in capsys.readouterr().out


def test_profile_run_sac_writes_trace_json_and_png(smollm2_dir, tmp_path, capsys):
    out = tmp_path / "sac"
    argv = ["profile", "run", "sac", "--strong-model", str(smollm2_dir), "--limit", "2", "--agents", "4", "--weak", "0",
            "--byzantine", "1", "--f", "1", "--rounds", "1", "--topology", "complete", "--max-tokens", "12",
            "--judge-max-tokens", "6", "--out", str(out), "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    data = check_profile(out, capsys, {"solve", "score"})
    assert data["summary"]["prefill_tokens"] > 0 and data["summary"]["decode_tokens"] > 0


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for a refused command")
    monkeypatch.setattr(byzantium.backends, "LLMPool", refuse)


def test_profile_refuses_the_hf_backend_and_bad_flags_before_loading(no_loading, tmp_path, capsys):
    assert main(["profile", "run", "rr", "--backend", "hf", "--out", str(tmp_path / "o")]) == 2
    assert "native" in capsys.readouterr().err
    assert main(["profile", "run", "rr", "--agents", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--agents" in capsys.readouterr().err
    assert main(["profile", "run", "rr", "--torch-profiler-steps", "0"]) == 2
    assert not (tmp_path / "o").exists()
