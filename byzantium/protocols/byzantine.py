"""Agents and threats for SAC and CP-WBFT.

Roles: "strong" (reliable), "weak" (faulty: a weaker model running the same protocol) and "adversary".
The adversary does not run the protocol: it replays cached answers written for OTHER problems (the
paper's "out-of-distribution weak-model response"), each checked with `is_correct` to be wrong for this
problem (the reference code never checked, so its adversary was sometimes right). It reports confidence
1.0 to confidence-based protocols. With `equivocate` it sends different wrong answers to different
neighbours. All choices are seeded with hashlib digests, never Python `hash()` (salted per process).
"""
import hashlib
import random
from dataclasses import dataclass

from ..tasks import is_correct, normalize_answer

ROLES = ("strong", "weak", "adversary")


def stable_seed(*parts) -> int:
    """The same integer for the same parts in every process."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


@dataclass
class Agent:
    id: int
    role: str = "strong"
    llm: object = None  # the LLM it runs (None for an adversary that only replays)
    adversary: "Adversary | None" = None

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"agent {self.id}: role must be one of {ROLES}, got {self.role!r}")
        if self.role == "adversary" and self.adversary is None:
            raise ValueError(f"agent {self.id}: an adversarial agent needs an Adversary")
        if self.role != "adversary" and self.llm is None:
            raise ValueError(f"agent {self.id}: an honest agent needs an LLM")

    @property
    def honest(self) -> bool:
        return self.role != "adversary"


def wrong_answers(task, cache) -> list:
    """Answers from `cache` (answers to other problems: strings, or (task_id, answer) pairs) that are
    verified wrong for `task`, distinct after normalisation, in cache order."""
    out, seen = [], set()
    for item in cache:
        source, answer = item if isinstance(item, tuple) else (None, item)
        if source == task.id or answer is None or is_correct(answer, task.gold, task.kind):
            continue
        key = normalize_answer(answer, task.kind) or str(answer)
        if key not in seen:
            seen.add(key)
            out.append(str(answer))
    return out or [_fallback_wrong(task)]


def _fallback_wrong(task) -> str:
    """A wrong answer when the cache has none for this problem (still checked wrong)."""
    if task.kind == "choice":
        return next(l for l in task.letters if l != task.gold)
    if task.kind == "bool":
        return "no" if normalize_answer(task.gold, "bool") == "yes" else "yes"
    try:
        return str(int(float(task.gold)) + 1)
    except ValueError:
        return f"{task.gold} + 1"


class Adversary:
    """Sends verified-wrong answers. message(receiver, round) -> answer string."""

    confidence = 1.0  # reported to confidence-based protocols

    def __init__(self, task, cache, seed=0, agent_id=0, equivocate=False):
        self.equivocate = equivocate
        self.pool = wrong_answers(task, cache)
        self.seed = (seed, task.id, agent_id)
        rng = random.Random(stable_seed(*self.seed))
        self.answer = rng.choice(self.pool)  # its "own" answer, used when it does not equivocate

    def message(self, receiver=None, round=0) -> str:
        if not self.equivocate or receiver is None:
            return self.answer
        # Equivocation: each receiver gets its own wrong answer (fixed across rounds).
        return self.pool[stable_seed(*self.seed, "to", receiver) % len(self.pool)]


def make_agents(strong_llm, weak_llm=None, n=7, weak=2, byzantine=1, task=None, cache=(), seed=0,
                equivocate=False) -> list:
    """The paper's line-up: agents 0.. strong, then weak, then adversarial (n=7: 4, 2, 1)."""
    strong = n - weak - byzantine
    if strong < 0 or weak < 0 or byzantine < 0:
        raise ValueError(f"n={n} cannot hold weak={weak} and byzantine={byzantine}")
    if weak and weak_llm is None:
        raise ValueError("weak agents need a weak model")
    if byzantine and task is None:
        raise ValueError("adversarial agents need the task (their answers are checked wrong for it)")
    agents = [Agent(i, "strong", strong_llm) for i in range(strong)]
    agents += [Agent(strong + i, "weak", weak_llm) for i in range(weak)]
    for i in range(strong + weak, n):
        agents.append(Agent(i, "adversary", adversary=Adversary(task, cache, seed, i, equivocate)))
    return agents
