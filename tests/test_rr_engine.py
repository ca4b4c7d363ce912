"""Round-robin on the engine: prefill accounting of RR sessions (from the engine's stats), MAJ / RR /
RRMaj end to end at 3c2t on the embedded SmolLM2 (RRMaj's trajectories batched together), and seeded
sampling: a rerun writes the same transcripts, and the shuffled orders give both final-speaker groups."""
import asyncio

import pytest

from byzantium.backends import load_llm
from byzantium.protocols.attacks import injection, make_agents
from byzantium.protocols.round_robin import round_robin, rr_majority
from byzantium.protocols.metrics.rr import final_speaker
from byzantium.protocols.rr_prompts import agent_messages
from byzantium.protocols.voting import majority_vote
from byzantium.tasks import extract_answer, get_task, is_correct, normalize_answer

N, C = 5, 3  # 3c2t: agents 0..2 corrupted


@pytest.fixture(scope="module")
def native(smollm2_dir):
    llm = load_llm(smollm2_dir, backend="native", num_blocks=512)
    yield llm
    llm.close()


class Metered:
    """The LLM, with the engine's stats read around every turn: what each continue_ prefilled and
    decoded, against what was appended to its session since its last turn. One trajectory at a time."""

    def __init__(self, llm):
        self.llm, self.turns, self.pending = llm, [], {}

    def __getattr__(self, name):
        return getattr(self.llm, name)

    async def open_session(self, prompt, untrusted=False):
        session = await self.llm.open_session(prompt, untrusted)
        self.pending[id(session)] = session.num_tokens  # the prompt: prefilled on its first turn
        return session

    async def extend(self, session, ids):
        self.pending[id(session)] += len(ids)
        return await self.llm.extend(session, ids)

    async def continue_(self, session, params=None, tag=None):
        before = self.llm.stats
        out = await self.llm.continue_(session, params, tag=tag)
        after = self.llm.stats
        delta = {k: after[k] - before[k] for k in ("prefill_tokens", "decode_tokens", "cached_tokens")}
        first = not any(t["session"] == id(session) for t in self.turns)
        self.turns.append(dict(delta, session=id(session), first=first, appended=self.pending[id(session)],
                               generated=len(out.token_ids)))
        self.pending[id(session)] = 0
        return out


def test_rr_session_prefill_accounting(native):
    # A question on which the corrupted context writes turns 0-2 and 5 and the clean one 3-4 (greedy, to L);
    # the bounds below hold however the trajectory ends.
    task = get_task("gen-arith", 2, seed=0)[1]
    k, max_len, block = 8, 48, native.engine.engine.block_size
    llm = Metered(native)
    native.reset_stats()
    traj = asyncio.run(round_robin(task, make_agents(llm, C, N), k=k, max_len=max_len, temperature=0.0,
                                   order="fixed"))
    stats = native.stats
    assert stats["preemptions"] == 0
    prompt = {bad: len(native.render_chat(agent_messages(task, injection(task) if bad else None)))
              for bad in (False, True)}

    # Two distinct contexts (corrupted, clean): at most two sessions ever computed anything.
    sessions = {t["session"] for t in llm.turns}
    assert len(sessions) <= 2 and len(llm.turns) == len(traj.chunks)
    # The bound on the whole trajectory.
    assert stats["prefill_tokens"] <= 2 * (max(prompt.values()) + max_len) + 2 * block

    # Exactly, turn by turn: a session's first turn prefills its prompt (less prefix-cache hits) and what
    # the other context wrote before it; each later turn prefills only what was appended since (the
    # other context's chunks) plus the one token it sampled last and has not computed yet. Never more:
    # no session is ever re-prefilled.
    for t, chunk in zip(llm.turns, traj.chunks):
        assert t["generated"] == chunk.tokens
        assert t["decode_tokens"] == chunk.tokens - 1  # the first token comes out of the prefill step
        if t["first"]:
            assert t["prefill_tokens"] == t["appended"] - t["cached_tokens"]
        else:
            assert t["cached_tokens"] == 0 and t["prefill_tokens"] == t["appended"] + 1
    # Per context: its prompt + the tokens it did not write itself + 1 per turn after its first.
    for bad in (False, True):
        mine = [t for t, c in zip(llm.turns, traj.chunks) if c.corrupted == bad]
        if not mine:
            continue
        last = max(j for j, c in enumerate(traj.chunks) if c.corrupted == bad)
        others = sum(c.tokens for c in traj.chunks[:last] if c.corrupted != bad)
        assert sum(t["prefill_tokens"] + t["cached_tokens"] for t in mine) == prompt[bad] + others + len(mine) - 1
    assert stats["prefill_tokens"] == sum(t["prefill_tokens"] for t in llm.turns)
    assert stats["decode_tokens"] == traj.num_tokens - len(traj.chunks)


def _check_vote(vote, answers, kind, voters):
    assert vote.abstentions == sum(normalize_answer(a, kind) is None for a in answers)
    assert vote.abstentions + sum(vote.counts.values()) == voters
    assert vote.answer is None or vote.answer in vote.counts


def test_maj_rr_rrmaj_end_to_end_3c2t(native):
    tasks = get_task("gen-arith", 2, seed=1) + get_task("gen-track", 1, seed=0, k=3)
    k, max_len = 8, 24
    agents = make_agents(native, C, N)

    async def run_all():
        return await asyncio.gather(
            asyncio.gather(*(majority_vote(t, agents, max_tokens=max_len) for t in tasks)),
            asyncio.gather(*(round_robin(t, agents, k=k, max_len=max_len) for t in tasks)),
            asyncio.gather(*(rr_majority(t, agents, k=k, max_len=max_len, temperature=0.7) for t in tasks)))

    native.reset_stats()
    maj, rr, rrmaj = asyncio.run(run_all())
    assert native.stats["max_batch_seqs"] >= N  # RRMaj's M = N trajectories' turns were in flight together
    eos = native.engine.engine.eos_token_ids
    for task, m, r, rm in zip(tasks, maj, rr, rrmaj):
        assert [a.agent for a in m.agents] == list(range(N))
        assert [a.corrupted for a in m.agents] == [i < C for i in range(N)]
        for a in m.agents:
            assert 0 < a.tokens <= max_len and a.answer == extract_answer(a.text, task.kind, task.choices)
        _check_vote(m.vote, [a.answer for a in m.agents], task.kind, N)
        assert m.correct == is_correct(m.answer, task.gold, task.kind)

        for traj in [r] + rm.trajectories:
            chunks = traj.chunks
            assert chunks and 0 < traj.num_tokens <= max_len  # ended by EOS (often a corrupted agent at once) or L
            assert sorted(traj.order) == list(range(N))
            assert [c.agent for c in chunks] == [traj.order[j % N] for j in range(len(chunks))]  # in its order
            assert [c.corrupted for c in chunks] == [c.agent < C for c in chunks]
            assert all(c.tokens == k for c in chunks[:-1]) and sum(c.tokens for c in chunks) == traj.num_tokens
            assert traj.text == "".join(c.text for c in chunks)
            ended = chunks[-1].token_ids[-1] in eos
            assert traj.finish_reason == ("stop" if ended else "length")
            assert ended or traj.num_tokens == max_len
            assert traj.answer == extract_answer(traj.text, task.kind, task.choices)  # None: abstains
        assert len(rm.trajectories) == N
        _check_vote(rm.vote, [t.answer for t in rm.trajectories], task.kind, N)
        assert rm.correct == is_correct(rm.answer, task.gold, task.kind)


def test_seeded_sampling_reruns_identically_and_both_final_speakers_occur(native):
    # The defaults: temperature 0.7, a shuffled speaking order per trajectory, a seed per request.
    tasks = get_task("gen-arith", 3, seed=2)
    agents = make_agents(native, 2, N)
    k, max_len = 4, 12

    async def run(seed, others=0):
        jobs = [rr_majority(t, agents, k=k, max_len=max_len, seed=seed) for t in tasks]
        jobs += [majority_vote(t, agents, max_tokens=max_len, seed=seed) for t in tasks]
        jobs += [round_robin(tasks[0], agents, k=k, max_len=max_len, seed=99, index=j) for j in range(others)]
        return (await asyncio.gather(*jobs))[:2 * len(tasks)]

    def transcripts(results):
        return [[(t.order, [c.token_ids for c in t.chunks]) for t in r.trajectories] if hasattr(r, "trajectories")
                else [a.text for a in r.agents] for r in results]

    first = asyncio.run(run(0))
    assert transcripts(asyncio.run(run(0, others=3))) == transcripts(first)  # other requests in the batch too
    assert transcripts(asyncio.run(run(1))) != transcripts(first)
    rrmaj, maj = first[:len(tasks)], first[len(tasks):]
    assert any(len({t.text for t in r.trajectories}) > 1 for r in rrmaj)  # M samples, not one counted M times
    assert any(len({a.text for a in r.agents[C:]}) > 1 for r in maj)  # clean agents: one prompt, several votes
    speakers = final_speaker(rrmaj)
    assert speakers["clean_n"] > 0 and speakers["corrupt_n"] > 0
    assert speakers["clean_n"] + speakers["corrupt_n"] + speakers["skipped"] == len(tasks) * N
