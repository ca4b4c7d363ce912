"""Token-level round-robin (RR) and RRMaj ("The Consensus Trap").

RR: N agents write ONE answer together. On turn t agent order[t mod N] continues the shared text for
exactly K tokens (fewer only at end of sequence), reading it under its own prompt (the question, plus the
injection when corrupted) as its own reply in progress. The trajectory ends when any agent emits
end-of-sequence or the text reaches L tokens; its answer is parsed from the final text.

The speaking order is drawn per trajectory (`speaking_order`). With one fixed order 0..N-1 (agent t mod N)
and agents 0..c-1 corrupted, every trajectory would open with a corrupted agent and, whenever L is reached
after a number of turns that is 1 mod N (K=100, L=512: 6 turns), close with agent 0: the final-speaker
analysis would have no clean-last trajectories. `shuffle` (the default) draws a permutation from
(seed, question, trajectory); `rotate` starts trajectory m at agent m mod N; `fixed` is 0..N-1.

Each distinct context (model, prompt) is one LLM session, kept between turns: on an agent's turn its
session is extended by what the others wrote since it last wrote or read (an append prefill, never
a re-encoding), then continued for K tokens. Agents with identical contexts (same model, same prompt:
e.g. all honest agents on one model) read identical tokens, so they share one session. Handoffs are
token ids between models with the same tokenizer, and text (only the new part tokenized, as plain
untrusted text) otherwise.

Corrupted agents write their turns as `attack_mode` says (attacks.py): "inject" (the paper's) as above;
"trajectory" and "logprob" (adaptive.py) have no session: each turn they read the whole shared text as
token ids (an honest reader's handoff rules) and write their K tokens with `generate`, from a prompt that
quotes the honest agents' text since their last turn (trajectory), or as the best of a few sampled
continuations by the target's log-probability (logprob). Their chunks record what they did (`attack`).

RRMaj: M trajectories (default M = N) run concurrently, each with its own seeds and speaking order;
plurality over their answers with MAJ's tie rule. Batching comes from the engine: the M trajectories' turns are in flight
at once.
"""
import asyncio
import json
import random
from dataclasses import dataclass, field

from ..backends import SamplingParams
from ..tasks import extract_answer
from . import adaptive
from .attacks import ATTACK_MODES, CANDIDATES, injection
from .distractor import distractor
from .rr_prompts import TEMPERATURE, agent_messages
from .plurality import Vote, plurality, stable_seed


@dataclass
class Chunk:
    agent: int  # who wrote it
    corrupted: bool
    tokens: int  # generated tokens (an end-of-sequence token included)
    text: str
    token_ids: list = field(default_factory=list)  # in the writer's tokenizer
    attack: dict | None = None  # an adaptive corrupted agent's turn: what it read or how it chose


@dataclass
class Trajectory:
    task_id: str
    index: int  # which of the M trajectories
    text: str
    answer: str | None
    correct: bool
    finish_reason: str  # "stop" (an agent ended it) or "length" (L reached)
    num_tokens: int
    chunks: list = field(default_factory=list)
    order: list = field(default_factory=list)  # the agents' speaking order: turn t is order[t mod N]

    @property
    def last_agent(self):
        return self.chunks[-1].agent if self.chunks else None


@dataclass
class RRMajResult:
    task_id: str
    answer: str | None
    correct: bool
    vote: Vote
    trajectories: list = field(default_factory=list)


ORDERS = ("shuffle", "rotate", "fixed")


def speaking_order(n, order="shuffle", seed=0, task_id="", index=0) -> list[int]:
    """The agents in the order they speak in trajectory `index` of a question (then again, cyclically)."""
    if order == "fixed":
        return list(range(n))
    if order == "rotate":
        return [(index + i) % n for i in range(n)]
    if order == "shuffle":
        agents = list(range(n))
        random.Random(stable_seed("order", seed, task_id, index)).shuffle(agents)
        return agents
    raise ValueError(f"unknown order {order!r}; choose one of {', '.join(ORDERS)}")


class _Context:
    """One session and where its reader stands: chunks read, and its view of the reply as token ids. An
    adaptive corrupted agent's context has no session (session None), only the view; `prompts` holds its
    prompts as token ids (logprob: its own and an honest agent's)."""

    def __init__(self, llm, session, prompts=None):
        self.llm, self.session, self.prompts = llm, session, prompts
        self.seen = 0  # chunks of the shared text already in the session (or the view)
        self.reply = []  # the session's token ids after the prompt


def _chunk_text(llm, before, new, fallback):
    # Decoding a chunk alone can drop a leading space (SentencePiece) or split a character: take the
    # difference of the decoded reply with and without it instead.
    if llm.tokenizer is None:
        return fallback
    head, full = llm.decode(before), llm.decode(before + new)
    return full[len(head):] if full.startswith(head) else llm.decode(new)


async def round_robin(task, agents, k=100, max_len=512, attack="strong", temperature=TEMPERATURE, seed=0,
                      index=0, attack_seed=0, order="shuffle", attack_mode="inject",
                      candidates=CANDIDATES) -> Trajectory:
    """One RR trajectory on one question; `index` (with `seed`) picks its speaking order and its
    sampling seeds (one per turn). attack_mode: how corrupted agents write (attacks.ATTACK_MODES);
    candidates: continuations a logprob-guided agent samples a turn."""
    if k < 1 or max_len < 1:
        raise ValueError(f"need k >= 1 and max_len >= 1, got k={k}, max_len={max_len}")
    if attack_mode not in ATTACK_MODES:
        raise ValueError(f"unknown attack mode {attack_mode!r}; choose one of {', '.join(ATTACK_MODES)}")
    if attack_mode == "logprob" and candidates < 1:
        raise ValueError(f"a logprob-guided agent needs candidates >= 1, got {candidates}")
    speakers = speaking_order(len(agents), order, seed, task.id, index)
    corrupt = any(a.corrupted for a in agents)
    inject = injection(task, attack, attack_seed) if corrupt else None
    target = distractor(task, attack_seed) if corrupt else None  # the injection's target
    contexts, of_agent = {}, []
    try:
        for agent in agents:
            messages = agent_messages(task, inject if agent.corrupted else None)
            if agent.corrupted and attack_mode != "inject":  # no session: a view of the shared text
                key = (id(agent.llm), attack_mode)
                if key not in contexts:
                    own = [agent.llm.render_chat(messages), agent.llm.render_chat(agent_messages(task))] \
                        if attack_mode == "logprob" else None
                    contexts[key] = _Context(agent.llm, None, own)
                of_agent.append(contexts[key])
                continue
            key = (id(agent.llm), json.dumps(messages))
            if key not in contexts:
                contexts[key] = _Context(agent.llm, await agent.llm.open_session(messages))
            of_agent.append(contexts[key])
        chunks, writers, same = [], [], {}  # writers[j]: the context that wrote chunk j
        spoke = {}  # agent -> chunks written when it last spoke (what a trajectory-aware agent has seen)
        total, finish, turn = 0, "length", 0
        while total < max_len:
            i = speakers[turn % len(agents)]
            ctx = of_agent[i]
            new = []
            for chunk, writer in zip(chunks[ctx.seen:], writers[ctx.seen:]):
                pair = (id(ctx.llm), id(writer.llm))
                if pair not in same:
                    same[pair] = ctx.llm is writer.llm or ctx.llm.same_tokenizer(writer.llm)
                new += chunk.token_ids if same[pair] else ctx.llm.encode_plain(chunk.text)
            if new:
                if ctx.session is not None:
                    await ctx.llm.extend(ctx.session, new)
                ctx.reply += new
            want = min(k, max_len - total)
            params = SamplingParams(max_tokens=want, temperature=temperature,
                                    seed=stable_seed("rr", seed, task.id, index, turn))
            note = None
            if ctx.session is not None:
                out = await ctx.llm.continue_(ctx.session, params, tag="turn")  # prefills what was appended, then decodes
            elif attack_mode == "trajectory":
                read = [j for j in range(spoke.get(i, 0), len(chunks)) if not chunks[j].corrupted]
                recent = "".join(chunks[j].text for j in read)
                out = await adaptive.trajectory_turn(ctx.llm, task, target, ctx.reply, recent, params)
                note = {"mode": "trajectory", "read": read}
            else:
                seeds = [stable_seed("rr", seed, task.id, index, turn, "candidate", c) for c in range(candidates)]
                out, note = await adaptive.logprob_turn(ctx.llm, task, target, ctx.prompts[0], ctx.prompts[1], ctx.reply,
                                                        params, seeds, "".join(c.text for c in chunks),
                                                        max_len - total)
                note = {"mode": "logprob", **note}
            text = _chunk_text(ctx.llm, ctx.reply, out.token_ids, out.text)
            ctx.reply += out.token_ids
            chunks.append(Chunk(i, agents[i].corrupted, len(out.token_ids), text, list(out.token_ids), note))
            writers.append(ctx)
            ctx.seen = len(chunks)
            spoke[i] = len(chunks)
            total += len(out.token_ids)
            if out.finish_reason != "length" or len(out.token_ids) < want:
                finish = "stop"  # end of sequence (or the model's context is full)
                break
            turn += 1
    finally:
        for ctx in contexts.values():
            if ctx.session is not None:
                await ctx.llm.close_session(ctx.session)
    text = "".join(c.text for c in chunks)
    answer = extract_answer(text, task.kind, task.choices)
    return Trajectory(task.id, index, text, answer, task.accepts(answer), finish, total,
                      chunks, speakers)


async def rr_majority(task, agents, m=None, k=100, max_len=512, attack="strong", temperature=TEMPERATURE,
                      seed=0, attack_seed=0, order="shuffle", attack_mode="inject",
                      candidates=CANDIDATES) -> RRMajResult:
    """RRMaj: M (default N) concurrent RR trajectories, plurality over their answers."""
    m = len(agents) if m is None else m
    if m < 1:
        raise ValueError(f"need m >= 1 trajectories, got {m}")
    adaptive_mode = {} if attack_mode == "inject" else dict(attack_mode=attack_mode, candidates=candidates)
    trajectories = await asyncio.gather(*(
        round_robin(task, agents, k, max_len, attack, temperature, seed, j, attack_seed, order, **adaptive_mode)
        for j in range(m)))
    vote = plurality([t.answer for t in trajectories], task.kind, f"{seed}:{task.id}")
    return RRMajResult(task.id, vote.answer, task.accepts(vote.answer), vote,
                       list(trajectories))


__all__ = ["Chunk", "Trajectory", "RRMajResult", "ORDERS", "speaking_order", "round_robin", "rr_majority"]
