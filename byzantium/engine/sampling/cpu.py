"""The sampler.

Every request samples from its own random stream, row by row: the i-th token it samples races its
row's logits against Gumbel noise hashed from (its key, i) (`race`), so the tokens a request gets do not
depend on what else shares its batch, and kernels that round a logit differently almost never change
them (inverting the CDF, as before, let noise of 1e-6 in any logit flip a draw among tail tokens).
"""
import random

import torch

from ..backends.params import SamplingParams  # noqa: F401 - the request vocabulary belongs to the LLM interface
from ..kernels import cpu_ext
from .grammar import apply_bitmask


def make_generator(seed, device):
    """A request's own generator; without a seed it is seeded from the OS so runs differ."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _penalize(row, request):
    """OpenAI's presence and frequency penalties over the tokens this request generated so far."""
    generated = request.output_ids
    if not generated:
        return row
    counts = torch.bincount(torch.tensor(generated, device=row.device), minlength=row.numel())[:row.numel()]
    counts = counts.to(row.dtype)
    p = request.params
    return row - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).to(row.dtype)


M32, M64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


def request_key(request):
    """The request's random stream: its seed, else its generator's (OS-random) initial seed."""
    if request.params.seed is not None:
        return request.params.seed
    generator = getattr(request, "generator", None)
    return generator.initial_seed() if generator is not None else random.getrandbits(63)


def stream(key, counter):
    """Two 32-bit words naming the noise of a request's counter-th token (splitmix64 of key and counter)."""
    z = (key * 0x9E3779B97F4A7C15 + (counter + 1) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return z & M32, z >> 32


def _fmix32(h):
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & M32  # int64 products wrap; their low 32 bits are the uint32 product
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def gumbel_noise(lo, hi, ids):
    """The noise a race adds to the logits of token ids `ids` (int64) in the stream (lo, hi) (ints, or int64
    tensors broadcasting with ids; kernels/cpu_sampling.cpp computes the same in one pass):
    g = -log(-log u), u = (2 k + 1) / 2^24 with k the top 23 bits of a hash of (stream, id)."""
    h = (ids * 0x9E3779B1) & M32
    h = _fmix32(_fmix32(h ^ lo) ^ hi)
    u = ((h >> 9) * 2 + 1).float() * 2.0 ** -24
    return -torch.log(-torch.log(u))


def race(row, key, counter):
    """One token of `row` [V] (logits over the temperature, -inf for excluded tokens): argmax of row + Gumbel
    noise, which draws token i with probability softmax(row)_i."""
    lo, hi = stream(key, counter)
    kernels = cpu_ext.load() if row.device.type == "cpu" and row.dtype == torch.float32 else None
    if kernels is not None:
        token = kernels.race_sample(row.contiguous(), lo, hi)
        return token if token >= 0 else int(row.argmax())  # nothing finite to race: as argmax would
    ids = torch.arange(row.numel(), device=row.device)
    return int((row.float() + gumbel_noise(lo, hi, ids)).argmax())


def _argmax(logits):
    """torch.argmax(logits, -1) as a list; compiled on the CPU (165 vs 468 us at 32 x 49k rows)."""
    kernels = cpu_ext.load() if logits.device.type == "cpu" and logits.dtype == torch.float32 else None
    if kernels is not None and logits.is_contiguous():
        return kernels.argmax_rows(logits).tolist()
    return logits.argmax(dim=-1).tolist()


def check_constraints(requests, allowed):
    """A request with a structured-output constraint needs its grammar's mask (the engine computes it:
    grammar.py); a sampler called without masks (another backend) refuses it rather than ignore it."""
    masked = set(allowed[0]) if allowed is not None else set()
    for i, request in enumerate(requests):
        if i not in masked and getattr(request.params, "structured", None) is not None:
            raise ValueError("structured outputs (json_schema, json_object, regex, choice, grammar) are enforced "
                             "by the byzantium engine; this sampler was given no grammar mask for them")


def sample(logits, requests, allowed=None):
    """Pick one token per row of `logits` [N, V] (fp32) for `requests` (objects with .params, .generator).

    allowed: None, or the grammar masks of the constrained rows (grammar.masks: row indices, bitmask): those
    rows draw only among the tokens their grammar allows. Returns (tokens, logprobs) where logprobs[i] is
    None or a dict token_id -> log-probability holding the sampled token and the top `params.logprobs`
    tokens of the unmodified distribution (the model's, before any mask).
    """
    check_constraints(requests, allowed)
    work = logits if allowed is None else apply_bitmask(logits, allowed)
    # Greedy rows are done here, one argmax over all rows; sampled rows are drawn below.
    tokens = _argmax(work) if any(r.params.greedy for r in requests) else [0] * len(requests)
    for i, request in enumerate(requests):
        params = request.params
        penalized = params.presence_penalty or params.frequency_penalty
        if params.greedy:
            if penalized:
                tokens[i] = int(_penalize(work[i], request).argmax())
            continue
        row = (_penalize(work[i], request) if penalized else work[i]) / params.temperature
        if params.top_k > 0 and params.top_k < row.numel():
            kth = torch.topk(row, params.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            # Drop tokens once the mass before them already reaches top_p; the first token always stays.
            drop = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
            row = row.scatter(0, order[drop], float("-inf"))
        tokens[i] = race(row, request_key(request), len(request.output_ids))
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
