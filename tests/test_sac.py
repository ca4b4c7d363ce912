"""SAC: the filter, score parsing, prompts, the round structure on a scripted LLM, and end to end on the
embedded model."""
import asyncio
import math
import time
from types import SimpleNamespace

import networkx as nx
import pytest

from byzantium.protocols import byzantine, metrics, prompts, voting
from byzantium.protocols.byzantine import Adversary, Agent, make_agents, wrong_answers
from byzantium.protocols.plurality import stable_seed
from byzantium.protocols.graphs import complete
from byzantium.protocols.metrics.sac import instance_metrics, summarize, vote
from byzantium.protocols.sac import JUDGE_PARAMS, SOLVE_PARAMS, filter_neighbours, parse_score, run_sac
from byzantium.tasks import Task, get_task, is_correct

TASK = Task("t1", "Compute 6 * 7.", None, "42", "number")


def text_of(messages):
    return "\n".join(m["content"] for m in messages)


class ScriptedLLM:
    """Deterministic answers and scores. answers: list of answers per call to solve/refine (the last one
    repeats); scores: {answer: score} for judge prompts (generate mode writes `Score: x`).
    Records every call and the largest number of calls in flight at once."""

    def __init__(self, name, answers, scores, refine=None):
        self.name, self.answers, self.scores, self.refine_text = name, list(answers), scores, refine
        self.calls, self.in_flight, self.max_in_flight, self.seeds = [], 0, 0, []

    async def _enter(self, kind, messages, params=None):
        self.calls.append((kind, messages))
        self.seeds.append((kind, params.seed if params is not None else None))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0)  # let every other coroutine of the gather start first
        await asyncio.sleep(0)
        self.in_flight -= 1

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        system = messages[0]["content"]
        if system == prompts.JUDGE_SYSTEM:
            await self._enter("judge", messages, params)
            answer = messages[2]["content"].removeprefix("Proposed answer: ")
            return SimpleNamespace(text=f"Let me check. 6*7 = 42.\nScore: {self.scores[answer]}")
        kind = "refine" if "reliability score" in text_of(messages) else "solve"
        await self._enter(kind, messages, params)
        if kind == "refine" and self.refine_text is not None:
            return SimpleNamespace(text=self.refine_text)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return SimpleNamespace(text=f"Working...\nAnswer: {answer}")

    async def score(self, messages, candidates, untrusted=False, tag=None):
        await self._enter("logprob", messages)
        p = self.scores[messages[2]["content"].removeprefix("Proposed answer: ")]
        return {"Yes": math.log(max(p, 1e-9)), "No": math.log(max(1 - p, 1e-9))}


def kinds(llm):
    return [k for k, _ in llm.calls]


# ------------------------------------------------------------------------------------- the filter

def test_filter_strictly_below_and_min_f_lowest():
    scores = [(1, 0.9), (2, 0.3), (3, 0.5), (4, 0.6), (5, 0.1)]
    below, dropped, kept = filter_neighbours(0.6, scores, F=2)
    assert below == [2, 3, 5]  # 0.6 is not strictly below 0.6
    assert dropped == [5, 2]  # the two lowest of L
    assert kept == [1, 3, 4]


def test_filter_drops_at_most_len_l_and_ties_keep_neighbour_order():
    assert filter_neighbours(0.5, [(1, 0.9), (2, 0.2)], F=3) == ([2], [2], [1])
    below, dropped, kept = filter_neighbours(0.8, [(1, 0.4), (2, 0.4), (3, 0.4), (4, 0.9)], F=2)
    assert dropped == [1, 2] and kept == [3, 4]
    assert filter_neighbours(0.0, [(1, 0.0), (2, 0.5)], F=1) == ([], [], [1, 2])  # nobody below 0.0
    assert filter_neighbours(1.0, [(1, 0.2)], F=1) == ([1], [1], [])  # everyone dropped: empty kept set


# --------------------------------------------------------------------------------- score parsing

@pytest.mark.parametrize("text, expected", [
    ("Score: 0.8", (0.8, True)),
    ("first Score: 0.2 then I reconsider.\nScore: 0.9", (0.9, True)),  # the LAST marker
    ("Score: 1.7", (1.0, True)),
    ("score = -0.3", (0.0, True)),
    ("**Score:** 0.5 ...", (0.5, True)),
    ("Score: **1**", (1.0, True)),
    ("<think>Score: 0.1</think>Score: 0.7", (0.7, True)),
    ("<think>Score: 0.1 and the", (0.5, False)),  # an unclosed think block is working only
    ("", (0.5, False)),
    (None, (0.5, False)),
    # The reference's failure: the judge is cut off mid-working; it must not be scored by "12".
    ("Let me solve: 3 * 4 = 12, so the proposed answer 12", (0.5, False)),
    # The markdown models write.
    ("**Score**: 0.7", (0.7, True)),
    ("**Score:** 0.7", (0.7, True)),
    ("Score 0.6", (0.6, True)),
    ("Score: .7", (0.7, True)),
    ("Final **Score** = .25.", (0.25, True)),
    ("The scores were 3 and 4.", (0.5, False)),
    ("__Score__: 0.3", (0.3, True)),
    ("*Score*: 0.2", (0.2, True)),
    ("Score:\n**0.4**", (0.4, True)),
    ("Underscore 0.9", (0.5, False)),
    # Issue 30: verdicts the reference reads differently (it takes the first number in the reply and
    # divides anything > 1 by 10 or 100; ours reads the verdict and scales ratios/percents).
    ("0.8", (0.8, True)),  # bare reply to a prompt ending in "Score:"
    (" 0.65.\n", (0.65, True)),
    ("Score (0-1): 0.75", (0.75, True)),  # reference: 0.0 (the "0" of "0-1")
    ("The score is 0.30.", (0.3, True)),
    ("Score: [0.8]", (0.8, True)),
    ("Rating: 0.6", (0.6, True)),
    ("Score: 7/10", (0.7, True)),  # reference: 0.7 via 7 -> 7/10; ours reads the ratio itself
    ("8/10", (0.8, True)),
    ("Score: 3 out of 4", (0.75, True)),
    ("Score: 85%", (0.85, True)),  # was 1.0 (clipped)
    ("I would rate it 7 out of", (0.5, False)),  # no marker, not a bare value
    ("The answer 12 is wrong, I think", (0.5, False)),
])
def test_parse_score(text, expected):
    assert parse_score(text) == expected


# ---------------------------------------------------------------------------------------- prompts

def test_refine_prompt_orders_kept_by_score_two_decimals_and_substitutes_f():
    msgs = prompts.refine(TASK, "41", [("40", 0.3), ("42", 0.875), ("43", 0.3)], F=3)
    body = text_of(msgs)
    assert body.index("42 (reliability score: 0.88)") < body.index("40 (reliability score: 0.30)") \
        < body.index("43 (reliability score: 0.30)")  # highest first, ties in given order
    assert "Up to 3 of the other" in body and " f " not in body and "f-" not in body
    assert "Your previous answer: 41" in body
    assert msgs[2]["untrusted"] and "42" in msgs[2]["content"]  # neighbours' text is untrusted
    assert all(not m.get("untrusted") for i, m in enumerate(msgs) if i != 2)


def test_judge_prompts_mark_the_answer_untrusted_and_share_a_prefix():
    for build in (prompts.judge, prompts.judge_yes_no, prompts.judge_digit):
        a, b = build(TASK, "41"), build(TASK, "<|im_end|>")
        assert a[:2] == b[:2] and a[2]["untrusted"] and "Compute 6 * 7." in a[1]["content"]
    assert "Score:" in prompts.JUDGE_SYSTEM and "0.5" in prompts.JUDGE_SYSTEM


# -------------------------------------------------------------------------------------- the rounds

def agents_on(llms, adversary=None):
    agents = [Agent(i, "strong", llm) for i, llm in enumerate(llms)]
    if adversary is not None:
        agents.append(Agent(len(agents), "adversary", adversary=adversary))
    return agents


def test_one_round_filters_refines_and_records():
    # Agent 0 answers 42 (self 0.9), agent 1 answers 41, agent 2 answers 42; adversary 3 sends 7.
    scores = {"42": 0.9, "41": 0.4, "7": 0.1}
    llms = [ScriptedLLM("a", ["42", "42"], scores), ScriptedLLM("b", ["41", "42"], scores),
            ScriptedLLM("c", ["42", "42"], scores)]
    adv = Adversary(TASK, ["7"], seed=0)
    rec = asyncio.run(run_sac(TASK, complete(4), agents_on(llms, adv), F=1, T=1))

    r0, r1 = rec["rounds"]
    assert [a["answer"] for a in r0["agents"]] == ["42", "41", "42", "7"]
    a0 = r1["agents"][0]
    assert a0["scores"] == {1: 0.4, 2: 0.9, 3: 0.1}
    assert a0["below"] == [1, 3] and a0["dropped"] == [3] and a0["kept"] == [1, 2]
    # The refine prompt of agent 0 shows the kept answers, highest score first, not the adversary's.
    refine = text_of(next(m for k, m in llms[0].calls if k == "refine"))
    assert refine.index("42 (reliability score: 0.90)") < refine.index("41 (reliability score: 0.40)")
    assert "Answer: 7" not in refine
    a1 = r1["agents"][1]  # self 0.4: only the adversary (0.1) is below, and it is dropped
    assert a1["threshold"] == 0.4 and a1["dropped"] == [3] and a1["answer"] == "42" and a1["previous"] == "41"
    assert a1["self_score"] == 0.9  # re-scored after changing its answer
    # Calls: solve, self-score, 3 neighbour scores, refine, re-score (every round, changed or not).
    assert kinds(llms[0]) == ["solve", "judge", "judge", "judge", "judge", "refine", "judge"]
    assert kinds(llms[1]) == ["solve", "judge", "judge", "judge", "judge", "refine", "judge"]
    m = instance_metrics(rec)
    assert m["IAA"] == 0.5 and m["FAA"] == 0.75 and m["BFTI"] == 0.25 and m["RA"] == 1.0


class DriftingJudge(ScriptedLLM):
    """A judge whose score of the same answer drifts by round (as sampling at temperature 0.1 may):
    `self_scores` is the score of each of agent's own judgements in turn, neighbours score from `scores`."""

    def __init__(self, name, answers, scores, self_scores):
        super().__init__(name, answers, scores)
        self.own, self.self_scores = answers[0], list(self_scores)

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        if messages[0]["content"] == prompts.JUDGE_SYSTEM and \
                messages[2]["content"].removeprefix("Proposed answer: ") == self.own:
            await self._enter("judge", messages, params)
            return SimpleNamespace(text=f"Score: {self.self_scores.pop(0)}")
        return await super().chat(messages, params, untrusted, tag)


def judge_calls_by_round(llm, agent, neighbours, T, seed=0):
    """How many judge calls `llm` made in each round 0..T, told apart by their seeds (one per round,
    agent and judged agent)."""
    seeds = [s for k, s in llm.seeds if k == "judge"]
    return [sum(seeds.count(stable_seed(seed, TASK.id, agent, t, "judge", j)) for j in [agent, *neighbours])
            for t in range(T + 1)]


@pytest.mark.parametrize("rescore, judges", [("always", 1 + 3 * (1 + 1)), ("changed", 1 + 3 * 1)])
def test_sac_rescores_every_round_by_default(rescore, judges):
    # Two agents on a path who never change their answers: "always" (Algorithm 1 line 7) re-scores each
    # round, so a drifting self-score moves the next round's threshold; "changed" keeps round 0's score.
    scores = {"42": 0.5, "41": 0.5}
    a = DriftingJudge("a", ["42"], scores, self_scores=[0.6, 0.4, 0.7, 0.3])
    b = ScriptedLLM("b", ["41"], scores)
    rec = asyncio.run(run_sac(TASK, nx.path_graph(2), agents_on([a, b]), F=1, T=3, rescore=rescore))
    assert kinds(a).count("judge") == judges
    # Round 0: the self-score; each round after: the neighbour, and the re-score unless "changed".
    assert judge_calls_by_round(a, 0, [1], T=3) == [1] + [2 if rescore == "always" else 1] * 3
    thresholds = [r["agents"][0]["threshold"] for r in rec["rounds"][1:]]
    if rescore == "always":
        assert thresholds == [0.6, 0.4, 0.7]  # each round filters against the last round's re-score
        assert [r["agents"][0]["dropped"] for r in rec["rounds"][1:]] == [[1], [], [1]]
        assert rec["rounds"][-1]["agents"][0]["self_score"] == 0.3
    else:
        assert thresholds == [0.6, 0.6, 0.6] and a.self_scores == [0.4, 0.7, 0.3]
    assert rec["rescore"] == rescore


def test_sac_refuses_an_unknown_rescore_mode():
    llms = [ScriptedLLM("a", ["42"], {"42": 0.5}), ScriptedLLM("b", ["42"], {"42": 0.5})]
    with pytest.raises(ValueError, match="rescore"):
        asyncio.run(run_sac(TASK, nx.path_graph(2), agents_on(llms), F=1, T=1, rescore="sometimes"))


def test_empty_kept_set_makes_no_call_and_keeps_answer():
    # A path 0-1 with F=1: agent 0 scores its only neighbour below itself, drops it, keeps nobody.
    scores = {"42": 0.9, "41": 0.2}
    llms = [ScriptedLLM("a", ["42"], scores), ScriptedLLM("b", ["41"], scores)]
    rec = asyncio.run(run_sac(TASK, nx.path_graph(2), agents_on(llms), F=1, T=2))
    for r in rec["rounds"][1:]:
        assert r["agents"][0]["kept"] == [] and r["agents"][0]["refine_called"] is False
        assert r["agents"][0]["answer"] == "42"
    assert "refine" not in kinds(llms[0])
    assert "refine" in kinds(llms[1])  # agent 1 (self 0.2) keeps agent 0 (0.9 is not below)


def test_unparsable_refinement_keeps_answer():
    scores = {"42": 0.9, "41": 0.9}
    llms = [ScriptedLLM("a", ["42"], scores, refine="I am not sure."),
            ScriptedLLM("b", ["41"], scores, refine="I am not sure.")]
    rec = asyncio.run(run_sac(TASK, nx.path_graph(2), agents_on(llms), F=1, T=1))
    a0 = rec["rounds"][1]["agents"][0]
    assert a0["refine_called"] and a0["refine_parsed"] is False and a0["answer"] == "42"
    assert kinds(llms[0]).count("judge") == 3  # self, neighbour, and the round's re-score of the kept answer


def test_scoring_calls_of_a_round_are_concurrent_and_failures_score_zero():
    shared = ScriptedLLM("s", ["42"], {"42": 0.9, "41": 0.4, "7": 0.1})

    class Failing(ScriptedLLM):
        async def chat(self, messages, params=None, untrusted=False, tag=None):
            if messages[0]["content"] == prompts.JUDGE_SYSTEM and "Proposed answer: 42" in text_of(messages):
                raise RuntimeError("backend down")
            return await super().chat(messages, params, untrusted, tag)

    failing = Failing("f", ["41"], {"42": 0.9, "41": 0.4, "7": 0.1})
    agents = [Agent(0, "strong", shared), Agent(1, "strong", shared), Agent(2, "weak", failing),
              Agent(3, "adversary", adversary=Adversary(TASK, ["7"]))]
    rec = asyncio.run(run_sac(TASK, complete(4), agents, F=1, T=1))
    assert shared.max_in_flight >= 6  # agents 0 and 1 score their 3 neighbours in one gather
    a2 = rec["rounds"][1]["agents"][2]
    assert a2["scores"][0] == 0.0 and a2["score_errors"]  # a raising scoring call counts 0.0


class SlowJudge(ScriptedLLM):
    """Its judgements of answer 41 wait until `release` is set."""

    def __init__(self, *args, release, **kwargs):
        super().__init__(*args, **kwargs)
        self.release = release

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        if messages[0]["content"] == prompts.JUDGE_SYSTEM and "Proposed answer: 41" in text_of(messages):
            await self.release.wait()
        return await super().chat(messages, params, untrusted, tag)


@pytest.mark.parametrize("lockstep", [False, True])
def test_an_agent_refines_without_waiting_for_the_others_judgements_unless_lockstep(lockstep):
    """Agent 1's round-1 judgement of agent 0's answer (41) hangs until agent 0 has refined: without
    lockstep agent 0 refines as soon as its own judgements are in; in lockstep nobody refines before
    every judgement is in, and the record is the same."""
    scores = {"42": 0.9, "41": 0.5}

    async def main():
        release = asyncio.Event()
        a = ScriptedLLM("a", ["41", "42"], scores)
        b = SlowJudge("b", ["42"], scores, release=release)
        original = a.chat

        async def chat(messages, params=None, untrusted=False, tag=None):
            out = await original(messages, params, untrusted, tag)
            if "reliability score" in text_of(messages):
                release.set()  # agent 0 has refined
            return out
        a.chat = chat
        agents = agents_on([a, b])
        # Round 0 calls judge 41 too (agent 0's self-score is from `a`, not `b`), so b only waits in round 1.
        run = asyncio.create_task(run_sac(TASK, nx.path_graph(2), agents, F=1, T=1, lockstep=lockstep))
        done, _ = await asyncio.wait([run], timeout=0.5)
        release.set()  # in lockstep agent 0's refinement waits for agent 1's judgement, which waits for it
        return bool(done), await run

    finished_alone, rec = asyncio.run(main())
    assert finished_alone != lockstep
    r1 = rec["rounds"][1]["agents"]
    assert r1[0]["refine_called"] and r1[0]["answer"] == "42" and r1[0]["previous"] == "41"
    assert r1[1]["scores"] == {0: 0.5}


def test_logprob_mode_uses_one_pass_per_score():
    scores = {"42": 0.8, "41": 0.3}
    llms = [ScriptedLLM("a", ["42"], scores), ScriptedLLM("b", ["41"], scores)]
    rec = asyncio.run(run_sac(TASK, nx.path_graph(2), agents_on(llms), F=0, T=1, score_mode="logprob"))
    assert "judge" not in kinds(llms[0]) and kinds(llms[0]).count("logprob") == 3  # self, neighbour, re-score
    assert rec["rounds"][0]["agents"][0]["self_score"] == pytest.approx(0.8)
    assert rec["rounds"][1]["agents"][0]["dropped"] == []  # F=0 drops nobody


# ------------------------------------------------------------------------------------- adversaries

def test_adversary_never_sends_a_correct_answer():
    tasks = get_task("gen-arith", 30, seed=3)
    cache = [(t.id, t.gold) for t in tasks] + [("x", "42"), ("y", "042"), ("z", "42.0")]
    for t in tasks + [TASK]:
        for eq in (False, True):
            adv = Adversary(t, cache, seed=5, agent_id=6, equivocate=eq)
            for receiver in range(7):
                assert not is_correct(adv.message(receiver, 1), t.gold, t.kind)
    assert wrong_answers(TASK, ["42", "42.0", "6*7"]) != []  # a cache with only right answers still works
    assert not is_correct(wrong_answers(TASK, ["42"])[0], "42", "number")


def test_adversary_is_seeded_stably_and_equivocates():
    cache = [str(v) for v in range(100)]
    a, b = Adversary(TASK, cache, seed=1, agent_id=6), Adversary(TASK, cache, seed=1, agent_id=6)
    assert a.answer == b.answer
    assert byzantine.stable_seed is voting.stable_seed  # one stable_seed in the code base
    eq = Adversary(TASK, cache, seed=1, agent_id=6, equivocate=True)
    assert len({eq.message(i) for i in range(6)}) > 1 and eq.message(2, 1) == eq.message(2, 5)
    assert eq.confidence == 1.0


def test_make_agents_lineup():
    s, w = ScriptedLLM("s", ["1"], {}), ScriptedLLM("w", ["1"], {})
    agents = make_agents(s, w, n=7, weak=2, byzantine=1, task=TASK, cache=["7"])
    assert [a.role for a in agents] == ["strong"] * 4 + ["weak"] * 2 + ["adversary"]
    assert agents[4].llm is w and agents[6].adversary.answer == "7"


# ------------------------------------------------------------------------------------------ metrics

def test_metrics_on_a_hand_made_record():
    def rnd(answers):
        return {"agents": [{"id": i, "answer": a} for i, a in enumerate(answers)]}
    rec = {"gold": "1/2", "kind": "math", "agents": [{"id": 0, "role": "strong"}, {"id": 1, "role": "strong"},
           {"id": 2, "role": "weak"}, {"id": 3, "role": "adversary"}],
           "rounds": [rnd(["0.5", "3", "3", "7"]), rnd(["\\frac{1}{2}", "0.5", "3", "7"])]}
    m = instance_metrics(rec)
    assert m["IAA"] == 0.25 and m["FAA"] == 0.5 and m["BFTI"] == 0.25
    assert m["RA"] == 1.0  # "\frac{1}{2}" and "0.5" vote together (the reference's RA split them)
    assert m["H-Majority"] == 1.0
    assert m["acc"]["strong"] == [0.5, 1.0] and m["acc"]["weak"] == [0.0, 0.0] and m["acc"]["honest"][1] == 2 / 3
    # The vote is voting.plurality; the metrics check an answer as an agent wrote it.
    assert not hasattr(metrics, "plurality") or metrics.plurality is voting.plurality
    assert vote(rec, ["3", "\\frac{1}{2}", "0.5", None]) == "\\frac{1}{2}" and vote(rec, [None]) is None
    s = summarize([rec, rec])
    assert s["instances"] == 2 and s["BFTI"] == 0.25 and s["acc"]["strong"] == [0.5, 1.0]


def hand_made(answers, roles, protocol="sac", task_id="t1", seed=0, decision=None):
    """A record whose every round holds `answers` (one per agent, roles as given)."""
    rnd = {"agents": [{"id": i, "answer": a} for i, a in enumerate(answers)]}
    return {"protocol": protocol, "task_id": task_id, "seed": seed, "gold": "42", "kind": "number",
            "decision": decision, "agents": [{"id": i, "role": r} for i, r in enumerate(roles)], "rounds": [rnd, rnd]}


def test_ra_is_the_papers_and_ra_all_counts_the_adversaries():
    roles = ["strong", "strong", "weak", "adversary", "adversary"]
    sac = instance_metrics(hand_made(["42", "42", "7", "7", "7"], roles))
    # SAC: the paper's RA is the honest agents' plurality (42); over all agents 7 wins.
    assert sac["RA"] == 1.0 and sac["H-Majority"] == 1.0 and sac["RA-all"] == 0.0
    # CP-WBFT: the paper's RA is the global decision, whatever the final answers are.
    cp = instance_metrics(hand_made(["7", "7", "7", "7", "7"], roles, "cpwbft", decision="42"))
    assert cp["RA"] == 1.0 and cp["RA-all"] == 0.0 and cp["H-Majority"] == 0.0
    s = summarize([hand_made(["42", "42", "7", "7", "7"], roles)] * 2)
    assert s["RA"] == 1.0 and s["RA-all"] == 0.0


def test_vote_ties_are_drawn_with_a_key_from_the_run_seed_and_problem():
    # Honest agents split 1-1 between right and wrong: voting.plurality's seeded draw decides, not the
    # order of the agents (and the draw is the same in every process).
    roles = ["strong", "weak"]
    for answers in (["42", "7"], ["7", "42"]):
        got = [instance_metrics(hand_made(answers, roles, task_id=f"p{k}", seed=3))["H-Majority"] for k in range(20)]
        want = [float(voting.plurality(answers, "number", f"3:p{k}").answer == "42") for k in range(20)]
        assert got == want and 0 < sum(got) < 20


# ------------------------------------------------------------------------------------ request seeds

def test_every_request_is_seeded_from_seed_problem_agent_round_and_purpose():
    def run(seed):
        scores = {"42": 0.9, "41": 0.4, "7": 0.1}
        llms = [ScriptedLLM("a", ["42", "41"], scores), ScriptedLLM("b", ["41", "42"], scores),
                ScriptedLLM("c", ["42"], scores)]
        rec = asyncio.run(run_sac(TASK, complete(4), agents_on(llms, Adversary(TASK, ["7"])), F=1, T=2, seed=seed))
        assert rec["seed"] == seed
        return [llm.seeds for llm in llms]
    first = run(0)
    seeds = [s for llm in first for _, s in llm]
    assert None not in seeds and len(set(seeds)) == len(seeds)  # every call its own seed
    assert run(0) == first and run(1) != first  # a rerun makes the same requests
    assert SOLVE_PARAMS.temperature == JUDGE_PARAMS.temperature == 0.1  # the paper's
    assert byzantine.DECOY_PARAMS.temperature == 0.1


# ------------------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    from byzantium.backends import load_llm
    llm = load_llm(smollm2_dir, backend="native", num_blocks=1024)
    yield llm
    llm.close()


@pytest.mark.parametrize("mode, n", [("logprob", 2), ("generate", 1)])  # generate decodes: one problem
def test_sac_end_to_end_on_the_embedded_model(smollm2, mode, n):
    from byzantium.engine.sampling import SamplingParams
    tasks = get_task("gen-arith", n, seed=0)
    cache = [(t.id, t.gold) for t in get_task("gen-arith", 10, seed=1)]
    solve = SamplingParams(max_tokens=32)
    judge = SamplingParams(max_tokens=16)  # mostly cut off before "Score:": exercises the 0.5 fallback

    async def main():
        runs = []
        for t in tasks:
            agents = make_agents(smollm2, n=4, weak=0, byzantine=1, task=t, cache=cache, seed=0)
            runs.append(run_sac(t, complete(4), agents, F=1, T=1, score_mode=mode,
                                solve_params=solve, judge_params=judge))
        return await asyncio.gather(*runs)

    start = time.perf_counter()
    records = asyncio.run(main())
    elapsed = time.perf_counter() - start
    for rec in records:
        assert len(rec["rounds"]) == 2 and len(rec["rounds"][1]["agents"]) == 4
        for a in rec["rounds"][1]["agents"][:3]:
            assert set(a["scores"]) == {0, 1, 2, 3} - {a["id"]} and 0.0 <= a["self_score"] <= 1.0
            assert len(a["dropped"]) <= 1 and set(a["dropped"]) <= set(a["below"])
        assert not is_correct(rec["rounds"][1]["agents"][3]["answer"], rec["gold"], rec["kind"])
    s = summarize(records)
    assert s["instances"] == n and s["BFTI"] is not None and len(s["acc"]["honest"]) == 2
    print(f"SAC {mode}: {n} instances in {elapsed:.1f}s")
