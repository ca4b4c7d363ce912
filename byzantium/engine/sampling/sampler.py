"""What a sampler is: one contract, two implementations (cpu.py row by row, cuda.py every row at once).

    sample(logits [N, V] fp32, requests, allowed=None) -> (tokens, logprobs)

requests: objects with .params (SamplingParams), .generator and .output_ids (the tokens sampled so far:
penalties count them, and the i-th token draws the stream's i-th noise, noise.py). allowed: None, or the
grammar masks of the constrained rows (grammar.masks: row indices, bitmask); those rows draw only among the
tokens their grammar allows. tokens[i] is an int; logprobs[i] is None, or {token_id: log-probability} with
the sampled token and the top `params.logprobs` tokens of the unmodified distribution (before any mask).
Both give the same tokens for the same logits and requests, except at near-ties (cuda.py says where)."""
from typing import Protocol


class Sampler(Protocol):
    def __call__(self, logits, requests, allowed=None) -> tuple[list[int], list[dict | None]]: ...


def check_constraints(requests, allowed):
    """A request with a structured-output constraint needs its grammar's mask (the engine computes it:
    grammar.py); a sampler called without masks (another backend) refuses it rather than ignore it."""
    masked = set(allowed[0]) if allowed is not None else set()
    for i, request in enumerate(requests):
        if i not in masked and getattr(request.params, "structured", None) is not None:
            raise ValueError("structured outputs (json_schema, json_object, regex, choice, grammar) are enforced "
                             "by the byzantium engine; this sampler was given no grammar mask for them")
