"""Each request's own random stream, shared by both samplers.

The i-th token a request samples races its row's logits against Gumbel noise hashed from (its key, i) and
each token id, so the tokens a request gets do not depend on what else shares its batch, and kernels that
round a logit differently almost never change them (inverting the CDF let noise of 1e-6 in any logit flip
a draw among tail tokens)."""
import random

import torch

M32, M64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


def make_generator(seed, device):
    """A request's own generator; without a seed it is seeded from the OS so runs differ."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


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
