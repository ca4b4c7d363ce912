"""The sampler.

Every request samples from its own seeded `torch.Generator`, row by row, so the tokens a request gets
do not depend on what else shares its batch.
"""
import torch

from ..backends.params import SamplingParams  # the request vocabulary belongs to the LLM interface


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


def draw(probs, generator):
    """One index of `probs` [V], by inverting its CDF at one uniform number from `generator`: index i with
    probability probs[i] (zero-probability entries never). torch.multinomial does the same job but took
    ~20 ms a row on our CPUs (a decode step of 32 sampled rows spent longer sampling than in the model);
    this takes ~0.1 ms. The CDF is summed in float64 so a 150k vocabulary's tail keeps its mass."""
    cdf = probs.double().cumsum(0)
    u = torch.rand(1, generator=generator, dtype=torch.float64, device=probs.device) * cdf[-1]
    return int(torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.numel() - 1))


def sample(logits, requests):
    """Pick one token per row of `logits` [N, V] (fp32) for `requests` (objects with .params, .generator).

    Returns (tokens, logprobs) where logprobs[i] is None or a dict token_id -> log-probability holding
    the sampled token and the top `params.logprobs` tokens of the unmodified distribution.
    """
    tokens = logits.argmax(dim=-1).tolist()  # greedy rows are done; sampled rows are overwritten below
    for i, request in enumerate(requests):
        params = request.params
        penalized = params.presence_penalty or params.frequency_penalty
        if params.greedy:
            if penalized:
                tokens[i] = int(_penalize(logits[i], request).argmax())
            continue
        row = (_penalize(logits[i], request) if penalized else logits[i]) / params.temperature
        if params.top_k > 0 and params.top_k < row.numel():
            kth = torch.topk(row, params.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            # Drop tokens once the mass before them already reaches top_p; the first token always stays.
            drop = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
            row = row.scatter(0, order[drop], float("-inf"))
        tokens[i] = draw(torch.softmax(row, dim=-1), request.generator)
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
