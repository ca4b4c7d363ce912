"""Plurality over answers, and the one seed rule of every protocol.

Votes are answers grouped by `normalize_answer`; an answer that cannot be parsed (None) abstains. Tie rule:
among the answers tied for the most votes, one is drawn with random.Random(f"tie:{tie_key}") over the
sorted tied answers, so a tie is broken the same way in every run and process (never Python's `hash()`).
No votes at all -> no answer. Every seed in the protocols comes from `stable_seed`, for the same reason.
"""
import hashlib
import random
from collections import Counter
from dataclasses import dataclass

from ..tasks import normalize_answer


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


__all__ = ["stable_seed", "Vote", "plurality"]
