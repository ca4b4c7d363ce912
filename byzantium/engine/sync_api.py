"""The blocking operations of an Engine, written on its core (add_requests, run_until_done, output):
generate, chat, logits, score, and round-robin sessions (open, extend, continue, close)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union, cast

import numpy as np
import torch

from .chat import plain_text_ids, render_chat
from .sampling import SamplingParams
from .sequence import Sequence, Session, Status

if TYPE_CHECKING:
    from .kv_cache import BlockManager

# What the calls take: a prompt is raw text, token ids, or a Session (the request is its next turn); a
# conversation is a list of {"role", "content"[, "untrusted"]} messages; a candidate is text or a token id.
Prompt = Union[str, list[int], Session]
Prompts = Union[Prompt, Iterable[Prompt]]
Params = Union[SamplingParams, list[SamplingParams], None]  # one for every prompt, or one each
Conversation = list[dict[str, Any]]
Candidate = Union[str, int]


@dataclass
class RequestOutput:
    request_id: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: list[dict[int, float]] | None = None
    prompt_token_ids: list[int] = field(default_factory=list, repr=False)
    # with SamplingParams.prompt_logprobs: per prompt token None (the first, or before the asked position)
    # or {token_id: log-prob}: the top k of its position and the token itself
    prompt_logprobs: list[dict[int, float] | None] | None = field(default=None, repr=False)


class Outputs(list[RequestOutput]):
    """A list of RequestOutput; when it holds one output, its attributes read through (outs.text)."""

    def __getattr__(self, name: str) -> Any:
        if len(self) == 1:
            return getattr(self[0], name)
        raise AttributeError(f"{len(self)} outputs: index one to read {name!r}")


def log_softmax_rows(logits: torch.Tensor) -> np.ndarray:
    """log-softmax of logits rows (a CPU tensor) in numpy, float64: single-threaded on purpose, because the
    AsyncEngine calls it on the event loop's thread, where a parallel torch op would start a second OpenMP
    team and slow every step (see AsyncEngine.__init__)."""
    x = logits.numpy().astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def prompt_list(prompts: Prompts) -> list[Prompt]:
    """A single prompt (a string, a list of ints, a Session) or a list of prompts -> a list of prompts."""
    if isinstance(prompts, (str, Session)) or (isinstance(prompts, (list, tuple)) and prompts and
                                               all(isinstance(t, int) for t in prompts)):
        return [cast(Prompt, prompts)]
    return list(cast(Iterable[Prompt], prompts))


def params_list(params: Params, n: int) -> list[SamplingParams]:
    """One SamplingParams for all n prompts, or one each -> a list of n."""
    params = SamplingParams() if params is None else params
    params = list(params) if isinstance(params, (list, tuple)) else [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
    return params


def candidate_lists(prompts: list[Prompt], candidates: list[Candidate] | list[list[Candidate]]
                    ) -> list[list[Candidate]]:
    """One candidate list per prompt: `candidates` is shared, or already one list per prompt."""
    one_each = bool(candidates) and isinstance(candidates[0], (list, tuple))
    per_prompt = cast(list[list[Candidate]], candidates if one_each else [candidates] * len(prompts))
    if len(per_prompt) != len(prompts):
        raise ValueError(f"got {len(per_prompt)} candidate lists for {len(prompts)} prompts")
    return per_prompt


class SyncAPI:
    """Mixed into Engine: each call queues its requests and steps until they end."""

    if TYPE_CHECKING:  # what the Engine provides
        tokenizer: Any  # a transformers tokenizer, or None
        config: Any  # the text model's config
        block_manager: BlockManager

        def add_requests(self, prompts: Prompts, params: Params = None, *, logits: bool = False,
                         tag: str | None = None, prompt_logprobs_from: list[int] | None = None) -> list[Sequence]: ...

        def run_until_done(self, seqs: list[Sequence]) -> list[Sequence]: ...

        def output(self, seq: Sequence) -> RequestOutput: ...

        def encode(self, prompt: str | list[int]) -> list[int]: ...

        def check_fits(self, num_tokens: int, what: str = "prompt") -> None: ...

        def new_request_id(self) -> int: ...

        def abort(self, seq: Sequence) -> None: ...

    def generate(self, prompts: Prompts, params: Params = None, *, tag: str | None = None) -> Outputs:
        """Generate for each prompt (raw text, no template, or token ids); outputs in prompt order."""
        seqs = self.run_until_done(self.add_requests(prompts, params, tag=tag))
        return Outputs(self.output(s) for s in seqs)

    def render_chat(self, conversation: Conversation, untrusted: bool = False,
                    add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a conversation under the model's chat template (see chat.render_chat)."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer, so no chat template")
        return render_chat(self.tokenizer, conversation, add_generation_prompt=add_generation_prompt, untrusted=untrusted)

    def chat_prompts(self, conversations: Conversation | list[Conversation], untrusted: bool = False
                     ) -> list[list[int]]:
        """Token ids of each conversation (one conversation, or a list of them)."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        return [self.render_chat(c, untrusted) for c in cast(list[Conversation], conversations)]

    def chat(self, conversations: Conversation | list[Conversation], params: Params = None, untrusted: bool = False,
             *, tag: str | None = None) -> Outputs:
        """Generate replies to conversations (lists of {"role", "content"[, "untrusted"]} messages)."""
        return self.generate(self.chat_prompts(conversations, untrusted), params, tag=tag)

    def logits(self, prompts: Prompts, *, tag: str | None = None) -> torch.Tensor:
        """Next-token logits (fp32, [len(prompts), vocab]) after each prompt or session, in one batched
        forward pass when the prompts fit in max_batch_tokens. Sessions stay where they are."""
        seqs = self.run_until_done(self.add_requests(prompts, logits=True, tag=tag))
        return torch.stack([s.logits for s in seqs])

    def candidate_token_ids(self, candidates: Iterable[Candidate]) -> list[int]:
        """The first token of each candidate continuation (tokenized as plain text)."""
        ids = []
        for c in candidates:
            tokens = plain_text_ids(self.tokenizer, c) if isinstance(c, str) else [int(c)]
            if not tokens:
                raise ValueError(f"candidate {c!r} has no tokens")
            ids.append(tokens[0])
        return ids

    def score(self, prompts: Prompts, candidates: list[Candidate] | list[list[Candidate]], *,
              tag: str | None = None) -> list[dict[Candidate, float]]:
        """For each prompt, {candidate: log-probability of the candidate's first token as the next token}.

        candidates: one list for every prompt, or one list per prompt. One batched forward pass."""
        prompts = prompt_list(prompts)
        per_prompt = candidate_lists(prompts, candidates)
        return self.logprobs_of(self.logits(prompts, tag=tag), per_prompt)

    def logprobs_of(self, logits: torch.Tensor, per_prompt: list[list[Candidate]]) -> list[dict[Candidate, float]]:
        logprobs = log_softmax_rows(logits)
        return [dict(zip(cands, logprobs[i, self.candidate_token_ids(cands)].tolist()))
                for i, cands in enumerate(per_prompt)]

    def loglikelihood(self, pairs: Iterable[tuple[str, str] | tuple[list[int], list[int]]], *,
                      tag: str | None = None) -> list[tuple[float, bool]]:
        """For each (context, continuation) pair: (the log-probability of the continuation's tokens after the
        context, whether greedy decoding gives exactly them). Pairs of token ids are taken as they are; text is
        split as lm-eval does: the continuation is what encoding context + continuation adds after the
        context's tokens. All pairs go in one batch; a context's blocks are computed once and shared by its
        continuations through the prefix cache (only the continuations' positions need logits)."""
        prompts, firsts = [], []
        for context, continuation in pairs:
            ctx, cont = self.split_pair(context, continuation)
            prompts.append(ctx + cont)
            firsts.append(len(ctx))
        params = SamplingParams(max_tokens=0, prompt_logprobs=1)
        seqs = self.run_until_done(self.add_requests(prompts, params, tag=tag, prompt_logprobs_from=firsts))
        results: list[tuple[float, bool]] = []
        for seq, first in zip(seqs, firsts):
            logprobs = cast(list[dict[int, float]], seq.prompt_logprobs)  # an entry at every position from `first`
            entries = [(seq.token_ids[p], logprobs[p]) for p in range(first, seq.output_start)]
            total = sum(entry[token] for token, entry in entries)
            greedy = all(entry[token] >= max(entry.values()) for token, entry in entries)
            results.append((total, greedy))
        return results

    def split_pair(self, context: str | list[int], continuation: str | list[int]) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids) of a log-likelihood pair (see loglikelihood)."""
        if isinstance(context, str) != isinstance(continuation, str):
            raise TypeError("a log-likelihood pair is two strings or two lists of token ids, not one of each")
        if isinstance(context, str) and isinstance(continuation, str):
            ctx, whole = self.encode(context) if context else [], self.encode(context + continuation)
            if whole[:len(ctx)] != ctx:
                raise ValueError(f"context {context[-40:]!r} does not tokenize to a prefix of context + continuation")
            ctx, cont = ctx, whole[len(ctx):]
        else:
            ctx, cont = [int(t) for t in context], [int(t) for t in continuation]
        if not ctx:
            raise ValueError("the context has no tokens: the first token has no log-probability (begin it "
                             "with the model's BOS or end-of-text token)")
        if not cont:
            raise ValueError("the continuation has no tokens")
        return ctx, cont

    # -- sessions -----------------------------------------------------------------------------------
    def open_session(self, prompt: str | list[int], *, tag: str | None = None) -> Session:
        """A pinned sequence for round-robin turns; its KV stays cached until close_session. Its requests
        carry `tag` unless they are given their own."""
        ids = self.encode(prompt)
        self.check_fits(len(ids), "session prompt")
        return Session(Sequence(self.new_request_id(), ids, None, pinned=True, status=Status.IDLE), tag)

    def extend(self, session: Session, tokens_or_text: str | list[int]) -> int:
        """Append tokens (ids, or text tokenized as plain untrusted text) to the session; only they get
        prefilled on the next continue_."""
        check_idle(session)
        if isinstance(tokens_or_text, str):
            ids = plain_text_ids(self.tokenizer, tokens_or_text)
        else:
            ids = [int(t) for t in tokens_or_text]
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ValueError(f"token ids {bad[:5]} are outside the vocabulary")
        self.check_fits(session.num_tokens + len(ids), "extended session")
        session.seq.token_ids.extend(ids)
        return len(ids)

    def continue_(self, sessions: Session | list[Session], params: Params = None, *, tag: str | None = None) -> Outputs:
        """Generate from where each session stands, keeping the KV; the tokens join the session."""
        seqs = self.run_until_done(self.add_requests(sessions, params, tag=tag))
        return Outputs(self.output(s) for s in seqs)

    def close_session(self, session: Session) -> None:
        """Free the session's blocks, whatever it is doing: a request in flight on it is aborted first."""
        if not isinstance(session, Session):
            raise TypeError(f"expected a Session, got {type(session).__name__}")
        if session.seq.status is Status.CLOSED:
            return
        self.abort(session.seq)
        self.block_manager.release(session.seq)
        session.seq.status = Status.CLOSED


def check_idle(session: Session) -> None:
    if not isinstance(session, Session):
        raise TypeError(f"expected a Session, got {type(session).__name__}")
    if session.seq.status is not Status.IDLE:
        raise ValueError(f"{session} is not idle: it is closed or has a request in flight")
