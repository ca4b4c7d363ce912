"""Majority voting (MAJ, "The Consensus Trap"): N agents answer alone; plurality over their answers.

Votes are answers parsed with `extract_answer`, counted by `plurality.plurality` (an answer that cannot
be parsed abstains; ties drawn with the key f"{seed}:{task id}", the same in every run and process).
No votes at all -> no answer (wrong).
"""
import asyncio
from dataclasses import dataclass, field

from ..backends import SamplingParams
from ..tasks import extract_answer
from .attacks import injection
from .plurality import Vote, plurality, stable_seed
from .rr_prompts import TEMPERATURE, agent_messages


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


async def majority_vote(task, agents, attack="strong", max_tokens=512, temperature=TEMPERATURE, seed=0,
                        attack_seed=0) -> MajResult:
    """MAJ on one question: every agent answers alone (all at once, so the engine batches them), each
    with its own sampling seed from (seed, question, agent)."""
    inject = injection(task, attack, attack_seed) if any(a.corrupted for a in agents) else None

    async def answer(i, agent):
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                seed=stable_seed("maj", seed, task.id, i))
        out = await agent.llm.chat(agent_messages(task, inject if agent.corrupted else None), params, tag="vote")
        return AgentAnswer(i, agent.corrupted, out.text, extract_answer(out.text, task.kind, task.choices),
                           len(out.token_ids))

    answers = await asyncio.gather(*(answer(i, a) for i, a in enumerate(agents)))
    vote = plurality([a.answer for a in answers], task.kind, f"{seed}:{task.id}")
    return MajResult(task.id, vote.answer, task.accepts(vote.answer), vote, list(answers))


__all__ = ["stable_seed", "Vote", "plurality", "AgentAnswer", "MajResult", "majority_vote"]
