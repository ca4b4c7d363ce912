"""Attention on x86 CPUs: the compiled decode kernel (cpu_attention.cpp) where it applies, the reference
elsewhere.

Decode at batch 32 spent most of its attention time gathering each sequence's K/V out of the block pool;
the kernel reads them in place (0.37 vs 8.3 ms a layer at batch 32, 176 tokens, SmolLM2's shapes:
`python bench/kernel_bench.py --cpu`). An append prefill of a few tokens (a round-robin turn: the other
agents' tokens added to a session) is the same computation row by row, new token j of a sequence being a
query over the first `seq_lens[b] - q_len + j + 1` positions, so it goes to the kernel too. Measured per
layer, 5 sequences with 1024 cached tokens, against the gather + SDPA path: 9.3x at 1 new token, 4.1x at
4, 2.4x at 8, 1.5x at 16, 1.1x at 32, 0.9x at 64. What the kernel does not cover (another dtype or head
size, a device other than the CPU, longer prefills) goes to the reference, whose contract it shares.

Sliding-window layers (`window=W`): the kernel always reads a sequence from its first token, so it takes
them only while no query is further than W tokens in (the window then changes nothing); past that they
go to the reference, which reads just the window.
"""
import torch

from . import cpu_ext, reference, warn_once
from .reference import store_kv  # noqa: F401 - part of this backend's three functions

ROW_BY_ROW_MAX_NEW = 32  # new tokens per sequence up to which an append prefill runs row by row (see above)


def available() -> bool:
    return cpu_ext.load() is not None


def unavailable_reason(device_type="cpu"):
    if device_type != "cpu":
        return f"they run on the CPU, this is {device_type}"
    return cpu_ext.unsupported_reason() or "their build failed (logged above)"


def _kernel(q, k_cache):
    ext = cpu_ext.load()
    if ext is None:
        return None
    if q.device.type != "cpu" or q.dtype != torch.float32 or k_cache.dtype != torch.float32:
        warn_once(f"byzantium: the CPU attention kernel takes fp32 CPU tensors; {q.dtype} on {q.device.type} "
                  f"uses the torch reference")
        return None
    if not ext.decode_supported(q.shape[-1]):
        warn_once(f"byzantium: the CPU attention kernel does not support head size {q.shape[-1]}; "
                  f"it uses the torch reference")
        return None
    return ext


def paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale, window=None):
    ext = _kernel(q, k_cache)
    if ext is None or not _within(window, seq_lens):
        return reference.paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale, window)
    return ext.paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale)


def append_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, window=None):
    ext = _kernel(q, k_cache)
    rows = None if ext is None or not _within(window, seq_lens) else reference._per_step(
        "cpu-rows", (cu_seqlens_q, seq_lens, block_tables), lambda: _rows(cu_seqlens_q, seq_lens, block_tables))
    if rows is None:
        return reference.append_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale,
                                                   window)
    row_lens, row_tables = rows
    return ext.paged_decode_attention(q, k_cache, v_cache, row_lens, row_tables, scale)


def _within(window, seq_lens):
    """Whether a window leaves every query of the step all of its keys (no window, or none longer)."""
    return window is None or reference._per_step(
        f"cpu-within-{window}", (seq_lens,), lambda: int(seq_lens.max()) <= window)


def _rows(cu_seqlens_q, seq_lens, block_tables):
    """Every new token as a decode query: (its visible length, its sequence's block table), or None when
    some sequence adds more than ROW_BY_ROW_MAX_NEW tokens."""
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    if int(q_lens.max()) > ROW_BY_ROW_MAX_NEW:
        return None
    owner = torch.repeat_interleave(torch.arange(len(q_lens), device=q_lens.device), q_lens)
    offset = torch.arange(len(owner), device=owner.device) - cu_seqlens_q[:-1].long()[owner]
    visible = seq_lens.long()[owner] - q_lens[owner] + offset + 1
    return visible.to(torch.int32), block_tables[owner]
