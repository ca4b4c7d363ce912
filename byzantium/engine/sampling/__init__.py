"""Sampling: how a request is decoded (params.py), the samplers that pick its tokens (sampler.py states their
contract; cpu.py goes row by row, cuda.py does every row at once on the device; both draw from the same
random stream, noise.py), and the loop that appends the tokens and decides when a request stops (append.py),
which speculation (drafts checked row after row) and structured outputs (grammar masks) plug into.

Only SamplingParams is imported here, so the LLM interface can speak it without loading torch."""
from .params import SamplingParams

__all__ = ["SamplingParams"]
