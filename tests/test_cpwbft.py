"""CP-WBFT as its reference code does it: confidence parsing, mean-confidence capture, global decision,
stopping, request seeds; the same answers under SAC; end to end on the embedded model."""
import asyncio
from types import SimpleNamespace

import networkx as nx
import pytest

from byzantium.protocols.byzantine import Adversary, Agent, make_agents
from byzantium.protocols.cpwbft import SOLVE_PARAMS, decide, local_update, parse_confidence, run_cpwbft
from byzantium.protocols.graphs import complete
from byzantium.protocols.metrics.sac import instance_metrics, summarize
from byzantium.protocols.sac import run_sac
from byzantium.tasks import Task, get_task, is_correct

TASK = Task("t1", "Compute 6 * 7.", None, "42", "number")


class ScriptedLLM:
    """Solve prompts: `Answer: a` + `Confidence: c`; judge prompts: `Score: scores[answer]`."""

    def __init__(self, answer, confidence, scores=None):
        self.answer, self.confidence, self.scores, self.calls, self.seeds = answer, confidence, scores or {}, 0, []

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        self.calls += 1
        self.seeds.append(params.seed if params is not None else None)
        await asyncio.sleep(0)
        if "Score:" in messages[0]["content"]:
            proposed = messages[2]["content"].removeprefix("Proposed answer: ")
            return SimpleNamespace(text=f"Score: {self.scores[proposed]}")
        return SimpleNamespace(text=f"6 * 7 = {self.answer}.\nAnswer: {self.answer}\nConfidence: {self.confidence}")


@pytest.mark.parametrize("text, expected", [
    ("Confidence: 0.8", 0.8),
    ("Confidence: 85%", 0.85),
    ("Confidence: 90", 0.9),  # > 1 means percent
    ("Confidence: 1", 1.0),
    ("Confidence: 250", 1.0),  # clipped
    ("Confidence: -0.2", 0.0),
    ("confidence = **0.7**", 0.7),
    ("Confidence: 0.2\nOn reflection, Confidence: 0.6", 0.6),
    ("no confidence given", 0.0),  # missing -> 0.0
    (None, 0.0),
    # The markdown models write.
    ("**Confidence**: 0.7", 0.7),
    ("**Confidence:** 0.7", 0.7),
    ("Confidence 0.6", 0.6),
    ("Confidence: .7", 0.7),
    ("**Confidence**: 85%", 0.85),
    ("I am confident in this.", 0.0),
    ("__Confidence__: 0.3", 0.3),
    ("*Confidence:* 90%", 0.9),
    # Issue 30: ratios (the reference reads 7/10 as 7 -> 0.07).
    ("Confidence: 7/10", 0.7),
    ("Confidence: 9 out of 10", 0.9),
    ("Answer: 42", 0.0),  # a bare answer is no confidence
    ("42", 0.0),
])
def test_parse_confidence(text, expected):
    assert parse_confidence(text) == pytest.approx(expected)


def test_local_update_highest_mean_beats_count():
    # One agent at 1.0 beats six at 0.9: the mean decides, not the count.
    assert local_update(("42", 0.9), [("42", 0.9)] * 5 + [("7", 1.0)], "number") == ("7", 1.0)
    # Equal means: the larger group wins.
    assert local_update(("42", 0.8), [("42", 0.8), ("7", 0.8)], "number") == ("42", 0.8)
    # Groups are formed on normalised answers; the agent keeps its own spelling.
    assert local_update(("42.0", 0.6), [("42", 1.0), ("7", 0.7)], "number") == ("42.0", 0.8)
    assert local_update((None, 0.0), [("7", 0.3)], "number") == ("7", 0.3)


def test_local_update_exact_tie_goes_to_the_first_neighbour_not_the_agent():
    # The reference adds the neighbours first (by sender id) and the agent's own answer last.
    assert local_update(("42", 0.8), [("7", 0.8)], "number") == ("7", 0.8)
    assert local_update(("42", 0.8), [("7", 0.8), ("9", 0.8)], "number") == ("7", 0.8)
    assert local_update(("42", 0.8), [("7", 0.6), ("9", 0.8)], "number") == ("9", 0.8)


def test_global_decision_keeps_confidences_at_least_half():
    # "42": confidences >= 0.5 are {0.9, 0.7} -> 0.8; "7": {0.6} -> 0.6.
    assert decide([("42", 0.9), ("42", 0.7), ("42", 0.1), ("7", 0.6)], "number") == ("42", pytest.approx(0.8))
    # No confidence >= 0.5 for an answer: all of its confidences count (7: 0.25).
    assert decide([("7", 0.4), ("7", 0.1), ("42", 0.3)], "number") == ("42", pytest.approx(0.3))
    assert decide([("7", 0.4), ("7", 0.2), ("42", 0.3)], "number")[0] == "7"  # equal means: the larger group
    assert decide([(None, 0.0)], "number") == (None, 0.0)


def test_global_decision_ties_by_kept_votes_then_agent_order():
    # Equal means (0.9): "42" has 3 votes but only one kept (>= 0.5), "7" has two kept: "7" wins.
    assert decide([("42", 0.9), ("42", 0.1), ("42", 0.1), ("7", 0.9), ("7", 0.9)], "number") == ("7", 0.9)
    assert decide([("42", 0.9), ("7", 0.9)], "number") == ("42", 0.9)  # full tie: the lower agent index
    assert decide([("7", 0.9), ("42", 0.9)], "number") == ("7", 0.9)


def test_global_decision_with_every_confidence_zero_is_a_majority_with_confidence_count_over_n():
    assert decide([("7", 0.0), ("42", 0.0), ("42", 0.0)], "number") == ("42", pytest.approx(2 / 3))
    assert decide([("7", 0.0), ("42", 0.0), (None, 0.0), ("7", 0.0)], "number") == ("7", 0.5)  # n counts all
    assert decide([("7", 0.0), ("42", 0.0)], "number") == ("7", 0.5)  # tie: agent order


def test_without_confidences_the_run_still_stops_after_round_one():
    agents = [Agent(i, "strong", ScriptedLLM("42", 0.0)) for i in range(3)]
    rec = asyncio.run(run_cpwbft(TASK, complete(3), agents, T=4))
    assert rec["rounds_run"] == 1 and rec["decision"] == "42" and rec["decision_confidence"] == 1.0


def test_a_global_tie_goes_to_the_lower_agent_index_not_the_adversary():
    # No edges: nobody updates. Agent 0 (honest, 42 at 1.0) and agent 1 (adversary, 7 at 1.0) tie.
    agents = [Agent(0, "strong", ScriptedLLM("42", 1.0)), Agent(1, "adversary", adversary=Adversary(TASK, ["7"]))]
    rec = asyncio.run(run_cpwbft(TASK, nx.empty_graph(2), agents, T=1))
    assert rec["decision"] == "42"
    assert instance_metrics(rec)["RA"] == 1.0  # CP-WBFT's RA is the global decision


def line_up(scores=None):
    """Complete graph of 7: six honest agents right at 0.9, one adversary sending 7 at 1.0."""
    honest = [Agent(i, "strong", ScriptedLLM("42", 0.9, scores)) for i in range(6)]
    return honest + [Agent(6, "adversary", adversary=Adversary(TASK, ["7"]))]


def test_adversary_at_confidence_one_captures_every_honest_neighbour():
    rec = asyncio.run(run_cpwbft(TASK, complete(7), line_up(), T=6))
    assert rec["rounds_run"] == 1  # the decision's confidence (1.0) >= 0.1: stop after round 1
    assert [a["answer"] for a in rec["rounds"][0]["agents"]] == ["42"] * 6 + ["7"]
    assert [a["answer"] for a in rec["rounds"][1]["agents"]] == ["7"] * 7
    assert rec["decision"] == "7" and rec["decision_confidence"] == 1.0
    m = instance_metrics(rec)
    assert m["IAA"] == pytest.approx(6 / 7) and m["FAA"] == 0.0 and m["H-Majority"] == 0.0
    assert m["RA"] == 0.0 and m["RA-all"] == 0.0


def test_sac_on_the_same_answers_keeps_the_honest_majority():
    rec = asyncio.run(run_sac(TASK, complete(7), line_up({"42": 0.9, "7": 0.1}), F=3, T=2))
    for agent in rec["rounds"][2]["agents"][:6]:
        assert agent["answer"] == "42" and agent["dropped"] == [6]
    m = instance_metrics(rec)
    assert m["H-Majority"] == 1.0 and m["RA"] == 1.0 and m["RA-all"] == 1.0 and m["FAA"] == pytest.approx(6 / 7)


def test_run_all_rounds_and_resolving_from_scratch():
    agents = line_up()
    rec = asyncio.run(run_cpwbft(TASK, complete(7), agents, T=3, run_all_rounds=True))
    assert rec["rounds_run"] == 3 and len(rec["rounds"]) == 4
    assert all(a["solved"] == "42" for r in rec["rounds"][1:] for a in r["agents"][:6])  # fresh each round
    assert agents[0].llm.calls == 3
    # Low confidence everywhere: the loop goes on until the decision reaches the threshold (never here).
    low = [Agent(i, "strong", ScriptedLLM("42", 0.05)) for i in range(3)]
    rec = asyncio.run(run_cpwbft(TASK, complete(3), low, T=4))
    assert rec["rounds_run"] == 4 and rec["decision"] == "42"


def test_every_solve_is_seeded_from_seed_problem_agent_and_round():
    def seeds(seed):
        agents = [Agent(i, "strong", ScriptedLLM("42", 0.05)) for i in range(3)]
        rec = asyncio.run(run_cpwbft(TASK, complete(3), agents, T=2, seed=seed))
        assert rec["seed"] == seed
        return [a.llm.seeds for a in agents]
    first = seeds(0)
    assert all(s is not None for agent in first for s in agent)
    assert len({s for agent in first for s in agent}) == 6  # 3 agents x 2 rounds, all different
    assert seeds(0) == first and seeds(1) != first  # a rerun makes the same requests
    assert SOLVE_PARAMS.temperature == 0.1  # the paper's


def test_cpwbft_end_to_end_on_the_embedded_model(smollm2_dir):
    from byzantium.backends import load_llm
    from byzantium.engine.sampling import SamplingParams
    llm = load_llm(smollm2_dir, backend="native", num_blocks=512)
    try:
        tasks = get_task("gen-arith", 2, seed=0)
        cache = [(t.id, t.gold) for t in get_task("gen-arith", 10, seed=1)]

        async def main():
            return await asyncio.gather(*(
                run_cpwbft(t, complete(4), make_agents(llm, n=4, weak=0, byzantine=1, task=t, cache=cache),
                           T=2, run_all_rounds=True, solve_params=SamplingParams(max_tokens=48))
                for t in tasks))
        records = asyncio.run(main())
    finally:
        llm.close()
    for rec in records:
        assert rec["rounds_run"] == 2 and len(rec["rounds"]) == 3
        for r in rec["rounds"][1:]:
            assert len(r["agents"]) == 4 and all(0.0 <= a["confidence"] <= 1.0 for a in r["agents"])
        assert not is_correct(rec["rounds"][0]["agents"][3]["answer"], rec["gold"], rec["kind"])
    s = summarize(records)
    assert s["instances"] == 2 and "RA-all" in s and len(s["acc"]["all"]) == 3
