"""The LLM interface every protocol calls: one model, async operations, tokens in and out.

A prompt is raw text (tokenized as the engine does, special tokens parsed), a list of token ids, or a
conversation (a list of {"role", "content"[, "untrusted"]} messages, rendered with the chat template
and the generation prompt). Text from other agents belongs in messages marked untrusted, or in
`extend`, which always tokenizes it as plain text (no special tokens parsed).

Implementations provide `_generate`, `_logprobs` and the four session operations; prompts are turned
into token ids here, once, so every backend sees exactly the same tokens.

Every call that makes a request takes `tag=`: a label of what the request is for in the protocol
("solve", "score", "turn", ...); the native engine's stats break its tokens and time down by tag.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union, cast

from ..engine.chat import plain_text_ids, render_chat
from ..engine.sampling import SamplingParams

if TYPE_CHECKING:
    import torch

# A prompt: raw text, token ids, or a conversation ({"role", "content"[, "untrusted"]} messages); a candidate
# answer to score: text or a token id.
Prompt = Union[str, list[int], list[dict[str, Any]]]
Candidate = Union[str, int]


class TokenSession:
    """A session kept as its token ids on the caller's side (backends without the engine's KV sessions);
    subclasses add where the rest of it lives."""

    def __init__(self, ids: Iterable[int]) -> None:
        self.ids, self.closed = list(ids), False

    @property
    def token_ids(self) -> list[int]:
        return list(self.ids)  # a copy, like the engine's Session

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tokens={len(self.ids)}, closed={self.closed})"


@dataclass
class Completion:
    text: str  # decoded without special tokens, cut before a matched stop string
    token_ids: list[int]  # every generated token (an end-of-sequence token included)
    finish_reason: str | None  # "stop" (eos, stop token or stop string) or "length"
    prompt_tokens: int
    cached_tokens: int = 0  # prompt tokens that needed no computation (prefix cache, session KV)
    logprobs: list[dict[int, float]] | None = None  # per generated token {token_id: log-prob}, when params.logprobs is set


class LLM(ABC):
    """One loaded model. Safe to share between agents and between concurrent coroutines."""

    name: str  # the model name it was loaded under
    tokenizer: Any  # a transformers tokenizer, or None (random test models: prompts as token ids)
    model_dir: object  # the resolved model directory
    # apply_chat_template's extra variables for every chat this model renders, e.g. {"enable_thinking":
    # False} for Qwen3 as the SAC paper ran it (an experiment file's [models."name"]); set per instance
    chat_template_kwargs: dict[str, Any] = {}

    # -- what implementations provide ------------------------------------------------------------------
    @abstractmethod
    async def _generate(self, ids: list[int], params: SamplingParams, tag: str | None = None) -> Completion: ...

    @abstractmethod
    async def _logprobs(self, ids: list[int], tag: str | None = None) -> torch.Tensor:
        """Log-probabilities (fp32 tensor [vocab]) of the next token after `ids`."""

    @abstractmethod
    async def open_session(self, prompt: Prompt, untrusted: bool = False) -> Any:
        """A handle (with .token_ids and .num_tokens) on a context that grows turn by turn."""

    @abstractmethod
    async def extend(self, session: Any, tokens_or_text: str | list[int]) -> int:
        """Append token ids, or text (plain, untrusted, as a continuation); returns the number of tokens."""

    @abstractmethod
    async def continue_(self, session: Any, params: SamplingParams | None = None, tag: str | None = None) -> Completion:
        """Generate from where the session stands; the generated tokens join the session."""

    @abstractmethod
    async def close_session(self, session: Any) -> None: ...

    @property
    def stats(self) -> dict[str, Any]:
        """Token and step counters (prefill_tokens, decode_tokens, ...)."""
        return {}

    def reset_stats(self) -> None:
        """Zero the counters (e.g. between a warm-up and a measured run)."""

    def describe(self) -> dict[str, Any]:
        """What runs this model (recorded in every run's summary.json)."""
        return {"backend": type(self).__name__, "model": getattr(self, "name", None)}

    def close(self) -> None:
        """Release what the model holds (threads, memory)."""

    # -- the operations protocols call -----------------------------------------------------------------
    async def generate(self, prompt: Prompt, params: SamplingParams | None = None, tag: str | None = None) -> Completion:
        """Continue a raw prompt (text without template, token ids) or a conversation."""
        return await self._generate(self.prompt_ids(prompt), params or SamplingParams(), tag=tag)

    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams | None = None, untrusted: bool = False,
                   tag: str | None = None) -> Completion:
        """Reply to a conversation; untrusted=True renders every non-system message as plain text."""
        return await self._generate(self.render_chat(messages, untrusted), params or SamplingParams(), tag=tag)

    async def next_token_logprobs(self, prompt: Prompt, untrusted: bool = False,
                                  tag: str | None = None) -> torch.Tensor:
        """Log-probabilities (fp32 tensor [vocab]) of the next token; one forward pass, no sampling.

        For expected-value scoring, e.g. over the digit tokens `self.candidate_ids("0123456789")`."""
        return await self._logprobs(self.prompt_ids(prompt, untrusted), tag=tag)

    async def score(self, prompt: Prompt, candidates: list[Candidate], untrusted: bool = False,
                    tag: str | None = None) -> dict[Candidate, float]:
        """{candidate: log-probability of its first token as the next token}, from one forward pass.

        Candidates are strings (their first plain-text token) or token ids."""
        logprobs = await self.next_token_logprobs(prompt, untrusted, tag=tag)
        return dict(zip(candidates, logprobs[self.candidate_ids(candidates)].tolist()))

    # -- tokens ------------------------------------------------------------------------------------------
    def prompt_ids(self, prompt: Prompt, untrusted: bool = False) -> list[int]:
        if isinstance(prompt, str):
            ids = self.encode(prompt)
        elif prompt and all(isinstance(m, dict) for m in prompt):
            ids = self.render_chat(cast("list[dict[str, Any]]", prompt), untrusted)
        else:
            ids = [int(t) for t in cast("list[int]", prompt)]
        if not ids:
            raise ValueError("empty prompt: a prompt needs at least one token")
        return ids

    def _need_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"model {self.name!r} has no tokenizer: give prompts as lists of token ids")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        """Token ids of a raw prompt, as the engine tokenizes one (special tokens parsed)."""
        return self._need_tokenizer().encode(text)

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of text from another agent, continuing a sequence: no special tokens parsed."""
        return plain_text_ids(self._need_tokenizer(), text, mid_sequence=True)

    def decode(self, token_ids: Iterable[int]) -> str:
        return self._need_tokenizer().decode(list(token_ids), skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, Any]], untrusted: bool = False, add_generation_prompt: bool = True) -> list[int]:
        return render_chat(self._need_tokenizer(), messages, add_generation_prompt=add_generation_prompt,
                           untrusted=untrusted, **self.chat_template_kwargs)

    def count_tokens(self, prompt: Prompt) -> int:
        return len(self.prompt_ids(prompt))

    def candidate_ids(self, candidates: Iterable[Candidate]) -> list[int]:
        """The first token of each candidate (a string, as plain text, or a token id)."""
        ids = []
        for c in candidates:
            tokens = plain_text_ids(self._need_tokenizer(), c) if isinstance(c, str) else [int(c)]
            if not tokens:
                raise ValueError(f"candidate {c!r} has no tokens")
            ids.append(tokens[0])
        return ids

    def same_tokenizer(self, other: "LLM") -> bool:
        """True when token ids mean the same to both models, so turns can be handed off as ids."""
        if self.tokenizer is None or other.tokenizer is None:
            # Tokenizer-less test models: ids are only shared within one model.
            return self.tokenizer is other.tokenizer and self.model_dir == other.model_dir
        return self.tokenizer is other.tokenizer or self._fingerprint() == other._fingerprint()

    def _fingerprint(self) -> str:
        # The fast tokenizer's full serialization (normalizer, pre-tokenizer, vocab, merges, added
        # tokens): equal serializations tokenize equally. Slow tokenizers: vocabulary and added tokens.
        if getattr(self, "_tokenizer_fingerprint", None) is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            text = backend.to_str() if backend is not None else repr(sorted(self.tokenizer.get_vocab().items()))
            self._tokenizer_fingerprint = hashlib.sha256(text.encode()).hexdigest()
        return self._tokenizer_fingerprint
