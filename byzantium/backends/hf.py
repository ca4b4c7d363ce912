"""The LLM interface on plain transformers, one request at a time: the simple reference and the
baseline the benchmarks compare the engine with.

Each request runs alone (an asyncio.Lock) in a worker thread (the event loop stays free): a prompt
forward pass, then one token per forward pass with transformers' KV cache. Tokens are picked by the
engine's sampler with a per-request seeded generator, so greedy and seeded sampling mean the same as on
the native backend. Sessions are token lists, re-encoded in full on every continue_. Request tags are accepted and
ignored: this backend keeps no per-step records to break down.
"""
import asyncio
import inspect
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from ..engine.config import resolve_device, resolve_dtype
from ..engine.loader import generation_config, load_tokenizer
from ..engine.sampling import SamplingParams
from ..engine.sampling.cpu import sample
from ..engine.sampling.noise import make_generator
from .base import LLM, Completion, TokenSession


class HFSession(TokenSession):
    """A session of the hf backend: just its tokens."""


def _zero_stats():
    return dict(prefill_tokens=0, decode_tokens=0, cached_tokens=0, steps=0, max_batch_seqs=0, requests=0)


class HFLLM(LLM):
    def __init__(self, model_dir, name=None, device=None, dtype=None, max_model_len=None):
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.model_dir = model_dir
        self.name = name or str(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self.dtype).to(self.device).eval()
        config = self.model.config
        self.vocab_size = config.vocab_size
        self.max_model_len = min(max_model_len or config.max_position_embeddings, config.max_position_embeddings)
        self.eos_token_ids = set()
        for source in (config, generation_config(model_dir), self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            self.eos_token_ids.update(value if isinstance(value, (list, tuple)) else [] if value is None else [value])
        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self._totals = _zero_stats()
        self._lock, self._lock_loop = None, None

    @property
    def stats(self):
        return dict(self._totals)

    def reset_stats(self):
        self._totals = _zero_stats()

    def describe(self):
        return {"backend": "hf", "model": self.name, "model_code": f"transformers {type(self.model).__name__}",
                "dtype": str(self.dtype).removeprefix("torch."), "device": str(self.device)}

    def close(self):
        self.model = None

    async def _serialized(self, fn, *args):
        # One request at a time. The lock belongs to the running loop (asyncio.run makes a new one).
        loop = asyncio.get_running_loop()
        if self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        async with self._lock:
            return await asyncio.to_thread(fn, *args)

    def _check(self, ids):
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; the model's context is {self.max_model_len} tokens "
                             f"and at least one must be left to generate")

    def _forward(self, inputs, cache):
        # The cache is filled in place; its keyword was renamed (past_key_values -> cache) in transformers 5.
        out = self.model(input_ids=torch.tensor([inputs], device=self.device), use_cache=True, logits_to_keep=1,
                         **{self._cache_arg: cache})
        self._totals["steps"] += 1
        self._totals["max_batch_seqs"] = 1
        return out.logits[:, -1].float()

    @torch.inference_mode()
    def _run_generate(self, ids, params):
        self._check(ids)
        self._totals["requests"] += 1
        request = SimpleNamespace(params=params, generator=make_generator(params.seed, self.device), output_ids=[])
        cache = DynamicCache()
        logits = self._forward(ids, cache)
        self._totals["prefill_tokens"] += len(ids)
        out, logprobs = request.output_ids, []  # the sampler reads output_ids for the penalties
        while True:
            (token,), (lp,) = sample(logits, [request])
            out.append(token)
            if lp is not None:
                logprobs.append(lp)
            finish, cut = self._stop(out, token, params, len(ids))
            if finish:
                break
            logits = self._forward([token], cache)
            self._totals["decode_tokens"] += 1
        text = self.decode(out) if self.tokenizer is not None else ""
        return Completion(text[:cut] if cut is not None else text, out, finish, len(ids), 0,
                          logprobs if params.logprobs is not None else None)

    def _stop(self, out, token, params, prompt_len):
        # The same rules as the engine: eos / stop token, then stop strings, then length.
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return "stop", None
        if params.stop and self.tokenizer is not None:
            text = self.decode(out)
            hits = [i for i in (text.find(s) for s in params.stop) if i >= 0]
            if hits:
                return "stop", min(hits)
        if len(out) >= params.max_tokens or prompt_len + len(out) >= self.max_model_len:
            return "length", None
        return None, None

    @torch.inference_mode()
    def _run_logprobs(self, ids):
        self._check(ids)
        self._totals["requests"] += 1
        logits = self._forward(ids, DynamicCache())
        self._totals["prefill_tokens"] += len(ids)
        return torch.log_softmax(logits[0], dim=-1).cpu()

    async def _generate(self, ids, params, tag=None):
        if not isinstance(params, SamplingParams):
            raise TypeError(f"expected SamplingParams, got {type(params).__name__}")
        return await self._serialized(self._run_generate, ids, params)

    async def _logprobs(self, ids, tag=None):
        return await self._serialized(self._run_logprobs, ids)

    # -- sessions: the whole context goes through the model again on every continue_ -----------------
    async def open_session(self, prompt, untrusted=False):
        ids = self.prompt_ids(prompt, untrusted)
        self._check(ids)
        return HFSession(ids)

    def _open(self, session):
        if not isinstance(session, HFSession):
            raise TypeError(f"expected an HFSession, got {type(session).__name__}")
        if session.closed:
            raise ValueError("the session is closed")
        return session

    async def extend(self, session, tokens_or_text):
        ids = self.encode_plain(tokens_or_text) if isinstance(tokens_or_text, str) else [int(t) for t in tokens_or_text]
        self._check(self._open(session).ids + ids)
        session.ids.extend(ids)
        return len(ids)

    async def continue_(self, session, params=None, tag=None):
        completion = await self._generate(self._open(session).token_ids, params or SamplingParams())
        session.ids.extend(completion.token_ids)
        return completion

    async def close_session(self, session):
        session.closed = True
