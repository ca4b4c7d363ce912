"""Majority voting (MAJ, "The Consensus Trap"): N agents answer alone; plurality over their answers.

Votes are answers parsed with `extract_answer` and grouped by `normalize_answer`; an answer that
cannot be parsed abstains. Tie rule: among the answers tied for the most votes, one is drawn with
random.Random(f"tie:{seed}:{task id}") over the sorted tied answers, so a tie is broken the same
way in every run and process (never Python's `hash()`). No votes at all -> no answer (wrong).
"""
import asyncio
import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field

from ..engine.sampling import SamplingParams
from ..tasks import extract_answer, normalize_answer
from .attacks import injection
from .rr_prompts import agent_messages


def stable_seed(*parts) -> int:
    """A 63-bit seed from any printable parts, the same in every process."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass
class Vote:
    answer: str | None  # the winning normalised answer; None when every voter abstained
    counts: dict  # normalised answer -> votes
    abstentions: int
    tie: bool  # the winner was drawn among tied answers


def plurality(answers, kind, tie_key) -> Vote:
    """Plurality over extracted answers (None = abstain); ties drawn with a seed from tie_key."""
    normed = [normalize_answer(a, kind) for a in answers]
    counts = Counter(a for a in normed if a is not None)
    abstentions = len(normed) - sum(counts.values())
    if not counts:
        return Vote(None, {}, abstentions, False)
    top = max(counts.values())
    tied = sorted(a for a, c in counts.items() if c == top)
    winner = random.Random(f"tie:{tie_key}").choice(tied) if len(tied) > 1 else tied[0]
    return Vote(winner, dict(counts), abstentions, len(tied) > 1)


@dataclass
class AgentAnswer:
    agent: int
    corrupted: bool
    text: str
    answer: str | None  # extracted; None = abstains
    tokens: int


@dataclass
class MajResult:
    task_id: str
    answer: str | None
    correct: bool
    vote: Vote
    agents: list = field(default_factory=list)  # AgentAnswer per agent


async def majority_vote(task, agents, attack="strong", max_tokens=512, temperature=0.0, seed=0,
                        attack_seed=0) -> MajResult:
    """MAJ on one question: every agent answers alone (all at once, so the engine batches them)."""
    inject = injection(task, attack, attack_seed) if any(a.corrupted for a in agents) else None

    async def answer(i, agent):
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                seed=stable_seed("maj", seed, task.id, i))
        out = await agent.llm.chat(agent_messages(task, inject if agent.corrupted else None), params)
        return AgentAnswer(i, agent.corrupted, out.text, extract_answer(out.text, task.kind, task.choices),
                           len(out.token_ids))

    answers = await asyncio.gather(*(answer(i, a) for i, a in enumerate(agents)))
    vote = plurality([a.answer for a in answers], task.kind, f"{seed}:{task.id}")
    return MajResult(task.id, vote.answer, task.accepts(vote.answer), vote, list(answers))


__all__ = ["stable_seed", "Vote", "plurality", "AgentAnswer", "MajResult", "majority_vote"]
