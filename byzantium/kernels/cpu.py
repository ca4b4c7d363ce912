"""Attention on x86 CPUs: the compiled decode and prefill kernels, reading K/V in place in the block pool.

Decode rows go to the decode kernel (cpu_decode.h; AVX-512 width where the CPU has it: a key row loaded
once for every query head that shares it). An append prefill of a few tokens (a round-robin turn: the
other agents' tokens added to a session) is the same computation row by row, new token j of a sequence
being a query over the first `seq_lens[b] - q_len + j + 1` positions, so it goes to the decode kernel too,
up to a number of new tokens measured on the machine at hand (`row_limit`, once per head shape, cached
with the linear choices; where row-by-row stops winning differs between CPUs) and applied per sequence: a
sequence's path depends on its own new tokens, not on what else is in the step. Longer appends and whole
prompts go to the tiled prefill kernel (cpu_prefill.h: 48 query rows a tile) on CPUs with AVX-512, and as
gather + SDPA (reference.py's prefill) on the others. Timings: bench/results/cpu_kernels.md.

Sliding-window and chunked layers (Gemma 3, Llama 4) take the same paths: both kernels start each query's
key loop at its first visible key (cpu_kernels.h's first_visible_key: p - window + 1, the start of p's
chunk), as reference.py's masks define them, and read nothing before it.

What the kernels cannot run is decided before a model runs (engine/attention_backend.py's table: fp32 or
bf16 K/V on the CPU, the head sizes of cpu_attention.cpp); such a model gets the torch backend. A call
outside that fails here.
"""
import functools

import torch

from . import cpu_ext, reference
from .notices import warn_once

CHUNKED_ATTENTION = True  # takes `chunk` (layers/attention.py asks before passing it)
ROW_LIMIT_CANDIDATES = (0, 1, 2, 4, 8, 16, 32, 64, 128)  # new tokens per sequence, timed by row_limit
BUSY_ROW_LIMIT = 32  # when the timings are noise (another process had the cores): what one quiet machine measured


def available() -> bool:
    return cpu_ext.load() is not None


def unavailable_reason(device_type="cpu"):
    if device_type != "cpu":
        return f"they run on the CPU, this is {device_type}"
    return cpu_ext.unsupported_reason() or "their build failed (logged above)"


def _kernel(q, k_cache):
    ext = cpu_ext.load()
    if ext is None:
        raise RuntimeError(f"the cpu attention backend needs the compiled CPU kernels ({unavailable_reason()})")
    if q.device.type != "cpu" or k_cache.dtype not in (torch.float32, torch.bfloat16) or not ext.decode_supported(
            q.shape[-1]):
        raise ValueError(f"the cpu attention backend takes an fp32 or bf16 KV cache on the CPU and head sizes of "
                         f"cpu_attention.cpp, not {k_cache.dtype} on {q.device.type} with head size {q.shape[-1]}")
    return ext


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    """One compiled copy for k and v (views whose heads are rows of contiguous dims taken as they are)."""
    k, v = (t if t.stride(2) == 1 and t.stride(1) == t.shape[2] else t.contiguous() for t in (k, v))
    cpu_ext.load().store_kv(k, v, k_cache, v_cache, slot_mapping.long())


def paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale, window=None, chunk=None):
    return _decode(_kernel(q, k_cache), q, k_cache, v_cache, seq_lens, block_tables, scale, window, chunk)


def append_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, window=None,
                             max_lens=None, chunk=None):
    ext = _kernel(q, k_cache)
    limit = row_limit(q.shape[1], k_cache.shape[-2], q.shape[-1], k_cache.shape[1])
    rows, rest = reference.per_step("cpu-split", (cu_seqlens_q, seq_lens, block_tables),
                                    lambda: _split(cu_seqlens_q, seq_lens, block_tables, limit))
    if rest is None:  # every sequence row by row
        return _decode(ext, q, k_cache, v_cache, rows[1], rows[2], scale, window, chunk)
    if rows is None:
        return _prefill(ext, q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, window, chunk)
    out = torch.empty_like(q)
    out[rows[0]] = _decode(ext, q[rows[0]], k_cache, v_cache, rows[1], rows[2], scale, window, chunk)
    out[rest[0]] = _prefill(ext, q[rest[0]], k_cache, v_cache, rest[1], rest[2], rest[3], scale, window, chunk)
    return out


def _decode(ext, q, k_cache, v_cache, seq_lens, block_tables, scale, window, chunk):
    """The kernel computes in fp32 (a bf16 cache is widened as it is read): queries in, output out. The
    kernels take window and chunk as sizes, 0 for none."""
    return ext.paged_decode_attention(q.float(), k_cache, v_cache, seq_lens, block_tables, scale,
                                      window=window or 0, chunk=chunk or 0).to(q.dtype)


def _prefill(ext, q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, window, chunk):
    """The tiled prefill kernel (cpu_prefill.h) where the CPU has AVX-512, gather + SDPA elsewhere."""
    if not ext.prefill_supported(q.shape[-1]):  # this CPU's prefill path (row_limit is measured against it)
        return reference.append_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale,
                                                  window=window, chunk=chunk)
    if q.dtype == k_cache.dtype == torch.bfloat16 and ext.avx512_bf16_supported():  # bf16 dot products, bf16 out
        return ext.paged_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale,
                                           window=window or 0, chunk=chunk or 0)
    return ext.paged_prefill_attention(q.float(), k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale,
                                       window=window or 0, chunk=chunk or 0).to(q.dtype)


def _split(cu_seqlens_q, seq_lens, block_tables, limit):
    """The sequences adding at most `limit` tokens, every new token a decode query: (their token indices,
    each token's visible length, its sequence's block table); and the others as an append prefill of
    their own: (token indices, cu_seqlens_q, seq_lens, block_tables). Either is None when empty."""
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    short = q_lens <= limit
    owner = torch.repeat_interleave(torch.arange(len(q_lens), device=q_lens.device), q_lens)
    offset = torch.arange(len(owner), device=owner.device) - cu_seqlens_q[:-1].long()[owner]
    token_short = short[owner]
    rows = rest = None
    if bool(token_short.any()):
        index = token_short.nonzero().squeeze(1)
        o = owner[index]
        visible = seq_lens.long()[o] - q_lens[o] + offset[index] + 1
        rows = (index, visible.to(torch.int32), block_tables[o])
    if not bool(short.all()):
        index = (~token_short).nonzero().squeeze(1)
        long_lens = q_lens[~short]
        cu = torch.zeros(len(long_lens) + 1, dtype=cu_seqlens_q.dtype, device=cu_seqlens_q.device)
        cu[1:] = long_lens.cumsum(0)
        rest = (index, cu, seq_lens[~short], block_tables[~short])
    return rows, rest


@functools.cache
def row_limit(num_heads, num_kv_heads, head_dim, block_size):
    """The most new tokens of a sequence for which row-by-row decode queries beat the prefill path (the
    tiled kernel, or gather + SDPA without AVX-512) on this machine (timed once per head shape, then read from the per-machine cache)."""
    from .linear_choice import TRIES, locked_cache, machine_key, remeasure
    ext = cpu_ext.load()
    rows = "rows512" if ext.avx512_supported() and head_dim % 16 == 0 else "rows"  # which decode kernel
    other = "tiles" if ext.prefill_supported(head_dim) else "sdpa"
    key = f"attention {rows} {num_heads}x{num_kv_heads}x{head_dim} block {block_size} vs {other}"
    with locked_cache() as cache:
        machine = cache.setdefault(machine_key(), {})
        if key in machine and not remeasure():
            return machine[key]["limit"]
        for _ in range(TRIES):
            measured, busy = _measure_row_limit(num_heads, num_kv_heads, head_dim, block_size)
            if not busy:
                break
        if busy:  # noisy timings choose nothing; the fixed fallback is kept, so that later starts agree
            warn_once(f"byzantium: the machine was busy while timing the CPU attention paths; {BUSY_ROW_LIMIT} new "
                      f"tokens is chosen and kept for this machine (BYZANTIUM_LINEAR_KERNELS=measure times it again)")
            measured = {**measured, "limit": BUSY_ROW_LIMIT, "busy": True}
        machine[key] = measured
        return measured["limit"]


def _measure_row_limit(num_heads, num_kv_heads, head_dim, block_size, batch=4, context=512):
    """Time both paths (interleaved rounds, best of each) for appends of 1..128 tokens to `batch`
    sequences of `context` cached tokens; the limit is the largest size up to which rows never lost.
    Returns ({"limit", "seconds"}, whether the machine was busy meanwhile)."""
    from .linear_choice import interleaved, noisy
    ext = cpu_ext.load()
    g = torch.Generator().manual_seed(0)
    width = -(-(context + max(ROW_LIMIT_CANDIDATES)) // block_size)
    k_cache = torch.randn(batch * width, block_size, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(batch * width, block_size, num_kv_heads, head_dim, generator=g)
    tables = torch.arange(batch * width, dtype=torch.int32).view(batch, width)
    seconds, limit, busy = {}, 0, False
    for new in ROW_LIMIT_CANDIDATES[1:]:
        q = torch.randn(batch * new, num_heads, head_dim, generator=g)
        cu = torch.arange(0, batch * new + 1, new, dtype=torch.int32)
        lens = torch.full((batch,), context + new, dtype=torch.int32)
        rows, _ = _split(cu, lens, tables, new)
        samples = interleaved({
            "rows": lambda: ext.paged_decode_attention(q, k_cache, v_cache, rows[1], rows[2], 0.125),
            "tiles": lambda: _prefill(ext, q, k_cache, v_cache, cu, lens, tables, 0.125, None, None)})
        busy = busy or noisy(samples)
        seconds[new] = {name: s[0] for name, s in samples.items()}
        if seconds[new]["rows"] > seconds[new]["tiles"]:
            break
        limit = new
    return {"limit": limit, "seconds": seconds}, busy
