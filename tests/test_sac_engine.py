"""SAC on the native engine: the scoring prompts of a round, over 5 instances, run in the same engine
steps, and logprob scoring never decodes. Counts come from the engine's stats and step records.

A whole run_sac call (5 instances, T=1, logprob) is checked through exact token accounting; then the
round's scoring is measured alone, in both score modes, by issuing it the way run_sac does (one gather
over every (agent, neighbour) pair of every instance) on that run's round-0 answers, between
reset_stats() and reading the stats.
"""
import asyncio

import pytest

from byzantium.engine.sampling import SamplingParams
from byzantium.protocols.byzantine import make_agents
from byzantium.protocols.graphs import complete
from byzantium.protocols.sac import Scorer, run_sac
from byzantium.tasks import get_task

# 3 honest agents x 3 neighbours x 5 instances = 45 scoring prompts a round: small enough for 2 CPU
# cores (each prompt prefills at least its last block), more sequences than any other phase has.
N, F, INSTANCES = 4, 1, 5
HONEST = N - 1
COUNT = INSTANCES * HONEST * HONEST


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    from byzantium.backends import load_llm
    # Default batch limits. No speculation: drafts let equally long replies end in different steps, and
    # these tests count on the instances reaching their scoring together.
    llm = load_llm(smollm2_dir, backend="native", num_blocks=1024, num_speculative_tokens=0)
    yield llm
    llm.close()


def cap(llm):
    return llm.engine.engine.max_num_seqs


class Recording:
    """Passes calls to the LLM and keeps every chat completion, so the decode tokens that chat calls
    must take are known exactly."""

    def __init__(self, llm):
        self.llm, self.name, self.completions, self.scores = llm, llm.name, [], 0

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        out = await self.llm.chat(messages, params, untrusted, tag=tag)
        self.completions.append(out)
        return out

    async def score(self, messages, candidates, untrusted=False, tag=None):
        self.scores += 1
        return await self.llm.score(messages, candidates, untrusted, tag=tag)


@pytest.fixture(scope="module")
def run(llm):
    """run_sac on 5 instances at once, T=1, logprob mode, with the stats and step records of the run."""
    tasks = get_task("gen-arith", INSTANCES, seed=0)
    cache = [(t.id, t.gold) for t in get_task("gen-arith", 10, seed=1)]
    rec = Recording(llm)
    agents = [make_agents(rec, n=N, weak=0, byzantine=1, task=t, cache=cache, seed=0, equivocate=True)
              for t in tasks]
    # A fixed number of tokens per reply keeps the instances in step, so their round-1 scoring prompts
    # reach the engine at the same time, as they do for a batch of equally long problems.
    solve = SamplingParams(max_tokens=8, ignore_eos=True)

    async def main():
        return await asyncio.gather(*(run_sac(t, complete(N), a, F, T=1, score_mode="logprob", solve_params=solve)
                                      for t, a in zip(tasks, agents)))
    llm.reset_stats()
    records = asyncio.run(main())
    return dict(tasks=tasks, agents=agents, records=records, recording=rec, stats=llm.stats,
                steps=list(llm.engine.step_records.records))


def test_whole_logprob_run_scoring_takes_no_decode_and_batches_across_instances(llm, run):
    s, rec = run["stats"], run["recording"]
    assert all(len(r["rounds"]) == 2 for r in run["records"])
    # A reply of k tokens takes k - 1 decode steps (its first token comes from a prefill step), so if
    # every decode token of the run belongs to a chat call, scoring decoded nothing.
    assert s["preemptions"] == 0 and rec.scores >= INSTANCES * HONEST + COUNT
    assert s["decode_tokens"] == sum(len(c.token_ids) - 1 for c in rec.completions)
    # Round 1's scoring prompts of all 5 instances share one step (solve, refine: 15 sequences at most).
    assert s["max_batch_seqs"] >= min(COUNT, cap(llm))
    assert any(r.num_seqs >= min(COUNT, cap(llm)) and r.decode_tokens == 0 for r in run["steps"])


def score_round(llm, run, mode, judge_params=None):
    """Round 1's scoring phase as run_sac issues it, on the run's round-0 answers: every honest agent
    scores every neighbour's message (adversaries equivocate), all pairs of all instances in one gather.
    Returns the number of prompts."""
    scorer = Scorer(mode, judge_params)
    calls = []
    for task, team, record in zip(run["tasks"], run["agents"], run["records"]):
        answer = {a["id"]: a["answer"] for a in record["rounds"][0]["agents"]}
        for a in team:
            if a.honest:
                calls += [(llm, task, answer[j] if team[j].honest else team[j].adversary.message(a.id, 1))
                          for j in sorted(complete(N).neighbors(a.id))]

    async def main():
        return await asyncio.gather(*(scorer(*c) for c in calls))
    llm.reset_stats()
    results = asyncio.run(main())
    assert all(0.0 <= r["score"] <= 1.0 for r in results)
    return len(calls)


def test_logprob_round_scoring_is_one_batched_prefill(llm, run):
    assert score_round(llm, run, "logprob") == COUNT
    s, records = llm.stats, llm.engine.step_records.records
    # Issued one after another, the prompts would take COUNT steps of one sequence each.
    assert s["max_batch_seqs"] >= min(COUNT, cap(llm))
    assert records[0].num_seqs == min(COUNT, cap(llm)) and s["steps"] == -(-COUNT // cap(llm))
    assert s["decode_tokens"] == 0 and s["prefill_tokens"] > 0


def test_generate_round_scoring_prefills_together_and_decodes_together(llm, run):
    max_tokens = 3
    assert score_round(llm, run, "generate", SamplingParams(max_tokens=max_tokens)) == COUNT
    s, records = llm.stats, llm.engine.step_records.records
    assert s["max_batch_seqs"] >= min(COUNT, cap(llm))
    assert records[0].num_seqs == min(COUNT, cap(llm)) and records[0].phase == "prefill"
    # One prefill step, then every judge decodes in the same steps: at most max_tokens steps in all.
    assert s["steps"] <= max_tokens * -(-COUNT // cap(llm))
    assert 0 < s["decode_tokens"] <= COUNT * (max_tokens - 1)


def test_agents_at_their_own_pace_write_the_same_record_as_lockstep(llm):
    """Generate mode, sampled (temperature 0.7, every call seeded): each agent refining as soon as its own
    judgements are in changes which calls share an engine step, not what any call returns."""
    tasks = get_task("gen-arith", 2, seed=3)
    cache = [(t.id, t.gold) for t in get_task("gen-arith", 10, seed=1)]
    params = SamplingParams(max_tokens=12, temperature=0.7)

    def records(lockstep):
        async def main():
            return await asyncio.gather(*(
                run_sac(t, complete(N), make_agents(llm, n=N, weak=0, byzantine=1, task=t, cache=cache, seed=0),
                        F, T=2, solve_params=params, judge_params=params, seed=5, lockstep=lockstep)
                for t in tasks))
        return asyncio.run(main())

    own_pace, lockstep = records(False), records(True)
    assert own_pace == lockstep
    assert any(a.get("refine_called") for r in own_pace for rnd in r["rounds"][1:] for a in rnd["agents"])
