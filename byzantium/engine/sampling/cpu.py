"""The CPU sampler (sampler.py's contract): row by row, each sampled row raced by the compiled kernel.

Greedy rows are one argmax over the batch; a sampled row applies its penalties, temperature, top-k and top-p,
then draws with its request's own noise (noise.py): argmax of the kept logits plus Gumbel noise.
"""
import torch

from ...kernels import cpu_ext
from ..grammar import apply_bitmask
from .noise import gumbel_noise, request_key, stream
from .sampler import check_constraints


def _penalize(row, request):
    """OpenAI's presence and frequency penalties over the tokens this request generated so far."""
    generated = request.output_ids
    if not generated:
        return row
    counts = torch.bincount(torch.tensor(generated, device=row.device), minlength=row.numel())[:row.numel()]
    counts = counts.to(row.dtype)
    p = request.params
    return row - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).to(row.dtype)


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
    """torch.argmax(logits, -1) as a list; the compiled kernel on the CPU (torch's is slower at a step's shape)."""
    kernels = cpu_ext.load() if logits.device.type == "cpu" and logits.dtype == torch.float32 else None
    if kernels is not None and logits.is_contiguous():
        return kernels.argmax_rows(logits).tolist()
    return logits.argmax(dim=-1).tolist()


def sample(logits, requests, allowed=None):
    """One token per row of `logits` [N, V] (fp32) for `requests`: sampler.py's contract."""
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
