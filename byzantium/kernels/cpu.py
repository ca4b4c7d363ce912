"""Attention on x86 CPUs: decode by the compiled kernel (cpu_attention.cpp), the rest by the reference.

Decode at batch 32 spends most of its attention time gathering each sequence's K/V out of the block
pool; the kernel reads them in place (measured 0.35 vs 9 ms a layer at batch 32, 176 tokens, SmolLM2
shapes: `bench/kernel_bench.py --cpu`). Anything it has no kernel for (another dtype or head
size, a device other than the CPU) goes to the reference, whose contract it shares.
"""
import torch

from . import cpu_ext, reference
from .reference import append_prefill_attention, store_kv  # noqa: F401 - part of this backend's three functions


def available() -> bool:
    return cpu_ext.load() is not None


def paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale):
    ext = cpu_ext.load()
    if (ext is None or q.device.type != "cpu" or q.dtype != torch.float32 or k_cache.dtype != torch.float32
            or not ext.decode_supported(q.shape[-1])):
        return reference.paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale)
    return ext.paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale)
