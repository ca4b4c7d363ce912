"""The state of one request (a Sequence) and of a round-robin session (a pinned Sequence)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the hints only: this module loads without torch
    import torch

    from .sampling.params import SamplingParams


class Status(Enum):
    WAITING = auto()  # queued; may already hold blocks (a preempted request holds none, a session keeps its own)
    RUNNING = auto()  # admitted: holds blocks, is prefilled or decoded each step
    FINISHED = auto()  # done (or aborted, or failed: see finish_reason and error); blocks released
    IDLE = auto()  # a session between turns: keeps its blocks, waits for extend / continue_
    CLOSED = auto()  # a closed session: blocks released


@dataclass
class Sequence:
    seq_id: int
    token_ids: list[int]
    params: SamplingParams | None  # None for a logits-only request
    generator: torch.Generator | None = None
    pinned: bool = False  # sessions: never preempted, blocks kept between turns
    logits_only: bool = False  # score/logits: one forward pass, no token sampled
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # chain hashes of the leading full blocks
    num_computed: int = 0  # tokens whose K/V are in the cache
    turn_start: int = 0  # index of the first token of this turn's prompt part (sessions: earlier turns)
    output_start: int = 0  # index of the first token generated in this turn
    num_cached_tokens: int | None = None  # prompt tokens served from the prefix cache at first admission
    finish_reason: str | None = None
    stop_text_at: int | None = None  # length of the output text before a matched stop string
    logprobs: list[dict[int, float]] = field(default_factory=list)
    logits: torch.Tensor | None = None  # logits-only result: fp32 [vocab]
    tag: str | None = None  # the caller's label for the stats ("score", "refine", "turn", ...)
    error: BaseException | None = None  # why the request failed (finish_reason "error")
    ngrams: dict[Any, Any] = field(default_factory=dict, repr=False)  # speculation.PromptLookup's index of this context
    ngrams_upto: int = 0  # tokens before this index are in `ngrams`
    # Prompt log-probabilities (prompt_logprobs.py): asked from this position on, top k each; per position
    prompt_logprobs_from: int | None = None
    prompt_logprobs_k: int = 0
    prompt_logprobs: list[dict[int, float] | None] | None = None
    grammar: Any = field(default=None, repr=False)  # its structured output's matcher (grammar.py), or None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.output_start:]

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.output_start

    def start_turn(self, params: SamplingParams | None, generator: torch.Generator | None,
                   logits_only: bool = False) -> None:
        """Begin a request on this sequence: everything up to now is its prompt."""
        self.params, self.generator, self.logits_only = params, generator, logits_only
        self.turn_start = self.num_computed
        self.output_start = len(self.token_ids)
        self.finish_reason, self.stop_text_at, self.logits, self.error = None, None, None, None
        self.logprobs = []
        self.status = Status.WAITING


@dataclass(eq=False)  # rows are compared by identity
class Row:
    """One sequence's part of a forward pass: its tokens [start, start + num_tokens) get computed.

    The one definition of the two phases: a "decode" row feeds the newest sampled token of the request
    to get the next one; every other row is "prefill" (a prompt or a chunk of one, tokens appended to a
    session, the recompute of a preempted request). A speculative step feeds a request its newest token and
    its draft tokens as single-token decode rows (speculation.py).
    """
    seq: Sequence
    start: int
    num_tokens: int
    token: int | None = None  # a draft token (speculation.py): the row's input, past the sequence's tokens
    verify: bool = False  # a row of a speculative step: its logits are sampled, whether or not it ends the sequence
    wasted: bool = False  # a speculative row after the step's last token: computed, but no token came of it

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def phase(self) -> str:
        return "decode" if self.num_tokens == 1 and self.start >= self.seq.output_start else "prefill"

    @property
    def ends_sequence(self) -> bool:
        """Its last token is the sequence's last: the step's logits for the sequence come from it."""
        return self.end == len(self.seq)


class Session:
    """A caller's handle on a pinned sequence that keeps its KV cache between round-robin turns."""

    def __init__(self, seq: Sequence, tag: str | None = None) -> None:
        self.seq = seq
        self.tag = tag  # the stats tag of its requests that are not given their own

    @property
    def token_ids(self) -> list[int]:
        return list(self.seq.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.seq.token_ids)

    @property
    def closed(self) -> bool:
        return self.seq.status is Status.CLOSED

    def __repr__(self) -> str:
        return f"Session(id={self.seq.seq_id}, tokens={len(self.seq)}, status={self.seq.status.name})"
