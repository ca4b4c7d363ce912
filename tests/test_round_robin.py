"""Round-robin (RR, RRMaj): turn order, chunk sizes, handoffs, session sharing, trajectory end and
authorship on a scripted LLM; then end to end on the embedded SmolLM2 (native engine vs hf)."""
import asyncio

import pytest

from byzantium.backends import load_llm
from byzantium.backends.base import Completion
from byzantium.protocols import round_robin as rr_module
from byzantium.protocols.attacks import injection, make_agents
from byzantium.protocols.round_robin import Trajectory, round_robin, rr_majority
from byzantium.protocols.rr_prompts import agent_messages
from byzantium.protocols.voting import majority_vote
from byzantium.tasks import Task, get_task

EOS = 0
TASK = Task("q", "Which one?", ["x", "y", "z"], "A", "choice")


class Session:
    def __init__(self, sid, prompt):
        self.sid, self.prompt, self.ids, self.closed = sid, prompt, [], False


class ScriptLLM:
    """Deterministic writer: the token at reply position p of a session is tag*10000 + 1000*(corrupted
    prompt) + p, so every token says which model and which context wrote it, and where. Words print as
    "<tok><id>"; text from another tokenizer is read back by its numbers. Every call is logged."""

    def __init__(self, tag, tok="a", eos_at=None):
        self.tag, self.tok, self.eos_at = tag, tok, eos_at
        self.tokenizer = tok  # not None: decode is available
        self.sessions, self.log, self.in_flight, self.max_in_flight = [], [], 0, 0

    async def open_session(self, prompt):
        s = Session(len(self.sessions), prompt)
        self.sessions.append(s)
        self.log.append(("open", s.sid))
        return s

    async def extend(self, s, ids):
        assert not s.closed and isinstance(ids, list)
        self.log.append(("extend", s.sid, list(ids)))
        s.ids += ids
        return len(ids)

    async def continue_(self, s, params):
        assert not s.closed
        self.log.append(("continue", s.sid, params.max_tokens, list(s.ids), params.seed))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0)  # let other trajectories run meanwhile, like an engine step
        self.in_flight -= 1
        bad = "Critical Instruction" in s.prompt[-1]["content"]
        out, finish = [], "length"
        for _ in range(params.max_tokens):
            if len(s.ids) == self.eos_at:
                out.append(EOS)
                s.ids.append(EOS)
                finish = "stop"
                break
            out.append(self.tag * 10000 + 1000 * bad + len(s.ids))
            s.ids.append(out[-1])
        return Completion(self.decode(out), out, finish, 0)

    async def close_session(self, s):
        s.closed = True

    def decode(self, ids):
        return "".join(f" {self.tok}{i}" for i in ids if i != EOS)

    def encode_plain(self, text):
        self.log.append(("encode_plain", text))
        return [int(w.lstrip(self.tok + "abcdefghijklmnopqrstuvwxyz")) for w in text.split()]

    def same_tokenizer(self, other):
        return self.tok == other.tok


def events(llm, kind):
    return [e for e in llm.log if e[0] == kind]


def test_turn_order_chunk_sizes_and_handoffs():
    llm = ScriptLLM(1)
    traj = asyncio.run(round_robin(TASK, make_agents(llm, corrupt=1, n=3), k=4, max_len=30))
    assert [c.agent for c in traj.chunks] == [0, 1, 2, 0, 1, 2, 0, 1]  # agent t mod N
    assert [c.tokens for c in traj.chunks] == [4] * 7 + [2]  # exactly K; fewer only at L
    assert traj.num_tokens == 30 and traj.finish_reason == "length"
    assert [c.corrupted for c in traj.chunks] == [True, False, False] * 2 + [True, False]
    for c in traj.chunks:  # authorship: the recorded writer's context produced these very tokens
        assert all(t // 1000 == 10 + c.corrupted for t in c.token_ids)
        assert c.text == llm.decode(c.token_ids)
    assert traj.text == llm.decode([t for c in traj.chunks for t in c.token_ids])
    # Two contexts (corrupted, honest): two sessions; the honest agents 1 and 2 share session 1.
    assert events(llm, "open") == [("open", 0), ("open", 1)]
    shared = [t for c in traj.chunks for t in c.token_ids]
    chunk = lambda j: traj.chunks[j].token_ids
    # Each turn extends with exactly what the OTHER context wrote since this one last wrote.
    assert [e[:3] for e in llm.log[2:9]] == [
        ("continue", 0, 4), ("extend", 1, chunk(0)), ("continue", 1, 4), ("continue", 1, 4),
        ("extend", 0, chunk(1) + chunk(2)), ("continue", 0, 4), ("extend", 1, chunk(3))]
    done = 0
    for e in events(llm, "continue"):  # at every turn the session holds the whole shared text so far
        assert e[3] == shared[:done]
        done += e[2]
    assert all(s.closed for s in llm.sessions)
    assert len({e[4] for e in events(llm, "continue")}) == 8  # a sampling seed per turn


def test_end_of_sequence_ends_the_trajectory():
    llm = ScriptLLM(1, eos_at=10)
    traj = asyncio.run(round_robin(TASK, make_agents(llm, corrupt=0, n=2), k=4, max_len=40))
    assert traj.finish_reason == "stop"
    assert [c.tokens for c in traj.chunks] == [4, 4, 3] and traj.chunks[-1].token_ids[-1] == EOS
    assert sum(c.tokens for c in traj.chunks) == traj.num_tokens == 11
    assert events(llm, "open") == [("open", 0)]  # two honest agents, one model: one session
    assert events(llm, "extend") == []  # nobody else ever wrote into it
    assert all(s.closed for s in llm.sessions)


def test_five_agents_three_corrupted_two_sessions():
    llm = ScriptLLM(1)
    traj = asyncio.run(round_robin(TASK, make_agents(llm, corrupt=3, n=5), k=3, max_len=20))
    assert [c.agent for c in traj.chunks] == [0, 1, 2, 3, 4, 0, 1]
    assert len(llm.sessions) == 2
    # Only a switch between the two contexts extends; all of the shared text is read exactly once
    # by each session (plus what it wrote itself): no token is ever fed twice.
    for s in llm.sessions:
        fed = [t for e in llm.log if e[0] == "extend" and e[1] == s.sid for t in e[2]]
        own = [t for c in traj.chunks for t in c.token_ids if c.corrupted == (s.sid == 0)]
        assert sorted(fed + own) == sorted(s.ids)
        assert s.ids == [t for c in traj.chunks for t in c.token_ids][:len(s.ids)]


def test_heterogeneous_handoffs_ids_or_text():
    a, a2, b = ScriptLLM(1, "a"), ScriptLLM(2, "a"), ScriptLLM(3, "b")
    agents = make_agents([a, b, a2], corrupt=[False, True, False])
    traj = asyncio.run(round_robin(TASK, agents, k=2, max_len=12))
    assert [c.agent for c in traj.chunks] == [0, 1, 2, 0, 1, 2]
    assert [len(m.sessions) for m in (a, b, a2)] == [1, 1, 1]  # different models never share
    c = [ch.token_ids for ch in traj.chunks]
    # b reads a's and a2's chunks as text (its own tokenizer, only the new part) ...
    assert events(b, "encode_plain") == [("encode_plain", traj.chunks[0].text),
                                         ("encode_plain", traj.chunks[2].text),
                                         ("encode_plain", traj.chunks[3].text)]
    assert events(b, "extend")[0][2] == c[0]  # the numbers survive the text round trip here
    # ... while a2 (same tokenizer as a) gets a's ids directly, and b's chunk as re-tokenized text.
    assert events(a2, "extend")[0][2] == c[0] + c[1]
    assert ("encode_plain", traj.chunks[1].text) in a2.log and ("encode_plain", traj.chunks[0].text) not in a2.log
    assert traj.text == "".join(ch.text for ch in traj.chunks) and " b3" in traj.text and " a1" in traj.text


def test_rrmaj_runs_trajectories_concurrently_with_distinct_seeds():
    llm = ScriptLLM(1)
    result = asyncio.run(rr_majority(TASK, make_agents(llm, corrupt=1, n=3), k=4, max_len=12, temperature=0.7))
    assert len(result.trajectories) == 3 and [t.index for t in result.trajectories] == [0, 1, 2]  # M = N
    assert llm.max_in_flight == 3  # all three trajectories' turns were in flight together
    seeds = [e[4] for e in events(llm, "continue")]
    assert len(set(seeds)) == len(seeds) == 9
    assert result.answer is None and not result.correct and result.vote.abstentions == 3  # no answers written


def test_rrmaj_plurality_over_trajectories(monkeypatch):
    answers = {0: "B", 1: "A", 2: None, 3: "B", 4: "A", 5: "A"}

    async def fake(task, agents, k, max_len, attack, temperature, seed, index, attack_seed):
        return Trajectory(task.id, index, "", answers[index], answers[index] == task.gold, "length", 0, [])

    monkeypatch.setattr(rr_module, "round_robin", fake)
    result = asyncio.run(rr_majority(TASK, make_agents("llm", 0, 3), m=6))
    assert (result.answer, result.correct, result.vote.counts, result.vote.abstentions) == ("A", True,
                                                                                            {"A": 3, "B": 2}, 1)
    tie = asyncio.run(rr_majority(TASK, make_agents("llm", 0, 3), m=2))  # B vs A: the seeded tie rule
    assert tie.vote.tie and tie.answer == asyncio.run(rr_majority(TASK, make_agents("llm", 0, 3), m=2)).answer
    with pytest.raises(ValueError):
        asyncio.run(rr_majority(TASK, make_agents("llm", 0, 3), m=0))
    with pytest.raises(ValueError):
        asyncio.run(round_robin(TASK, make_agents(ScriptLLM(1), 0, 3), k=0))


# -- end to end on the embedded SmolLM2 ------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol(smollm2_dir):
    llms = {b: load_llm(smollm2_dir, backend=b, **({"num_blocks": 256} if b == "native" else {}))
            for b in ("native", "hf")}
    yield llms
    for llm in llms.values():
        llm.close()


def test_smollm2_rr_and_maj_end_to_end(smol):
    native, hf = smol["native"], smol["hf"]
    # On gen-track the model answers at once (2 turns); a gen-arith question runs all the way to L.
    tasks = get_task("gen-track", 1, seed=0, k=3) + get_task("gen-arith", 1, seed=0)
    k, max_len = 8, 48
    corrupt = [False, True, False]  # an honest agent speaks first: a corrupted one ends it at once

    async def rr_all(llm):
        agents = make_agents(llm, corrupt)
        return await asyncio.gather(*(round_robin(t, agents, k=k, max_len=max_len) for t in tasks))

    native.reset_stats()
    trajs = asyncio.run(rr_all(native))
    stats = native.stats
    incremental = naive = 0
    for task, traj in zip(tasks, trajs):
        turns = len(traj.chunks)
        assert 0 < traj.num_tokens <= max_len and sum(c.tokens for c in traj.chunks) == traj.num_tokens
        assert [c.agent for c in traj.chunks] == [t % 3 for t in range(turns)]  # authors rotate
        assert all(c.tokens == k for c in traj.chunks[:-1]) and traj.text == "".join(c.text for c in traj.chunks)
        assert traj.finish_reason == ("stop" if traj.chunks[-1].token_ids[-1] in native.engine.engine.eos_token_ids
                                      else "length")
        prompt = {bad: len(native.render_chat(agent_messages(task, injection(task) if bad else None)))
                  for bad in (False, True)}
        # What the sessions must prefill: each context's prompt once, then on its turns only what the
        # other context wrote since (plus the one pending token it sampled last turn) ...
        incremental += turns - 2
        for bad in (False, True):
            incremental += prompt[bad]
            last = max(j for j, c in enumerate(traj.chunks) if c.corrupted == bad)
            incremental += sum(c.tokens for c in traj.chunks[:last] if c.corrupted != bad)
        # ... against re-encoding the agent's whole context every turn.
        naive += sum(prompt[c.corrupted] + sum(p.tokens for p in traj.chunks[:j]) for j, c in enumerate(traj.chunks))
    print(f"prefill tokens: engine {stats['prefill_tokens']}, incremental bound {incremental}, re-encoding {naive}")
    assert stats["prefill_tokens"] <= incremental < naive
    assert stats["max_batch_seqs"] >= 2  # the two questions' turns were batched together

    # The same tokens on plain transformers, which re-encodes every turn (greedy).
    hf_trajs = asyncio.run(rr_all(hf))
    for a, b in zip(trajs, hf_trajs):
        assert [c.token_ids for c in a.chunks] == [c.token_ids for c in b.chunks] and a.text == b.text
    assert hf.stats["prefill_tokens"] > stats["prefill_tokens"]

    # MAJ and RRMaj complete, with answers parsed by the tasks' extractor.
    assert trajs[1].num_tokens == max_len and trajs[1].finish_reason == "length"
    maj = asyncio.run(majority_vote(tasks[0], make_agents(native, corrupt), max_tokens=max_len))
    assert len(maj.agents) == 3 and maj.vote.abstentions + sum(maj.vote.counts.values()) == 3
    assert maj.correct == (maj.answer == tasks[0].gold)
    native.reset_stats()
    rrmaj = asyncio.run(rr_majority(tasks[1], make_agents(native, corrupt), k=k, max_len=max_len, temperature=0.7))
    assert len(rrmaj.trajectories) == 3 and native.stats["max_batch_seqs"] >= 3  # M trajectories batched
    assert len({t.text for t in rrmaj.trajectories}) > 1  # distinct seeds: the samples differ
