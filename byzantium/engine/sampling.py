"""Sampling parameters and the sampler.

Every request samples from its own seeded `torch.Generator`, row by row, so the tokens a request gets
do not depend on what else shares its batch.
"""
from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    seed: int | None = None
    stop: list[str] | str | None = None  # stop strings; the text is cut before them
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # return this many top log-probabilities per generated token

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self):
        return self.temperature == 0


def make_generator(seed, device):
    """A request's own generator; without a seed it is seeded from the OS so runs differ."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def sample(logits, requests):
    """Pick one token per row of `logits` [N, V] (fp32) for `requests` (objects with .params, .generator).

    Returns (tokens, logprobs) where logprobs[i] is None or a dict token_id -> log-probability holding
    the sampled token and the top `params.logprobs` tokens of the unmodified distribution.
    """
    tokens = logits.argmax(dim=-1).tolist()  # greedy rows are done; sampled rows are overwritten below
    for i, request in enumerate(requests):
        params = request.params
        if params.greedy:
            continue
        row = logits[i] / params.temperature
        if params.top_k > 0 and params.top_k < row.numel():
            kth = torch.topk(row, params.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            # Drop tokens once the mass before them already reaches top_p; the first token always stays.
            drop = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
            row = row.scatter(0, order[drop], float("-inf"))
        probs = torch.softmax(row, dim=-1)
        tokens[i] = int(torch.multinomial(probs, 1, generator=request.generator))
    logprobs = [None] * len(requests)
    wanted = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
    if wanted:
        all_logprobs = torch.log_softmax(logits[wanted], dim=-1)
        for row, i in zip(all_logprobs, wanted):
            top = torch.topk(row, requests[i].params.logprobs) if requests[i].params.logprobs else None
            entry = {tokens[i]: float(row[tokens[i]])}
            if top is not None:
                entry.update(zip(top.indices.tolist(), top.values.tolist()))
            logprobs[i] = entry
    return tokens, logprobs
