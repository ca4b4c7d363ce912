"""The LLM interface on this engine: every call becomes a request of one shared AsyncEngine, so the
calls of all agents and all problem instances in flight are batched together."""
import torch

from ..engine.async_engine import AsyncEngine
from ..engine.sync_api import log_softmax_rows
from ..engine.sampling import SamplingParams
from .base import LLM, Completion


def _completion(out):
    return Completion(out.text, list(out.token_ids), out.finish_reason, out.num_prompt_tokens,
                      out.num_cached_tokens, out.logprobs)


class NativeLLM(LLM):
    def __init__(self, model_dir, name=None, **engine_kwargs):
        """engine_kwargs go to AsyncEngine (device, dtype, num_blocks, max_num_seqs, ...)."""
        self.engine = AsyncEngine(model_dir, **engine_kwargs)
        self.model_dir = self.engine.engine.model_dir
        self.name = name or str(model_dir)
        self.tokenizer = self.engine.tokenizer

    @property
    def stats(self):
        return self.engine.stats

    def reset_stats(self):
        self.engine.reset_stats()

    def describe(self):
        return {"backend": "native", **self.engine.describe()}

    def close(self):
        self.engine.shutdown()

    async def _generate(self, ids, params, tag=None):
        return _completion((await self.engine.generate([ids], params, tag=tag))[0])

    async def _logprobs(self, ids, tag=None):
        logits = await self.engine.logits([ids], tag=tag)  # fp32; numpy keeps the loop's thread single-threaded
        return torch.from_numpy(log_softmax_rows(logits[0]).astype("float32"))

    async def open_session(self, prompt, untrusted=False):
        return await self.engine.open_session(self.prompt_ids(prompt, untrusted))

    async def extend(self, session, tokens_or_text):
        ids = self.encode_plain(tokens_or_text) if isinstance(tokens_or_text, str) else tokens_or_text
        return await self.engine.extend(session, ids)

    async def continue_(self, session, params=None, tag=None):
        return _completion((await self.engine.continue_([session], params or SamplingParams(), tag=tag))[0])

    async def close_session(self, session):
        await self.engine.close_session(session)
