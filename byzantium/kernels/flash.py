"""Attention over the paged KV cache with flash-attn (optional: `pip install 'byzantium[flash]'`).

Same three functions and cache layout as `reference.py`. flash-attn is imported only when an
attention function is first called, so this module imports (and `attention_ops` can name it) on
machines without it.

Block size: flash-attn 2's paged mode (`block_table=`) only accepts cache blocks whose size is a
multiple of 256 tokens. So an engine that wants this backend must be built with `block_size=256`
(or 512, ...), not the default 16, and what follows from that:
- the prefix cache shares whole blocks only, so prompts share their cached prefix in steps of 256
  tokens (a 1000-token common prefix reuses 768 tokens, not 992);
- every sequence holds up to 255 unused slots in its last block, so the same memory holds fewer
  concurrent sequences when they are short (many short agent turns: prefer the Triton backend);
- round-robin sessions extend within their last block until it fills, which is fine.
Other block sizes raise a ValueError here rather than failing inside flash-attn.

Needs fp16/bf16 tensors on a CUDA device (flash-attn's own limits). `append_prefill_attention` needs
the longest query and sequence lengths on the host (flash-attn sizes its grid with them): the runner
passes them (`max_lens`); without them it reads them back, one sync a call.
"""
import importlib.util

import torch
import torch.nn.functional as F

PAGE_MULTIPLE = 256


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    """Write k, v `[T, Hkv, D]` into the cache slots `slot_mapping[T]`; slot -1 means skip.

    The same job whatever computes attention: the Triton kernel on CUDA (no host sync), else the
    reference. Imported here, not at module import, so naming this module never imports triton.
    """
    if k.is_cuda and importlib.util.find_spec("triton") is not None:
        from .triton_ops import store_kv as store
    else:
        from .reference import store_kv as store
    store(k, v, k_cache, v_cache, slot_mapping)


def append_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, window=None,
                             max_lens=None):
    """Causal attention of new tokens over their sequence's cached prefix plus themselves.

    Contract as in `reference.append_prefill_attention`. flash-attn aligns the causal mask to the
    bottom right when there are fewer queries than keys, which is exactly "new token j sits at
    position seq_lens[b] - q_len_b + j"; its window is aligned the same way.
    """
    _check_block_size(k_cache)
    flash_attn_varlen_func = _flash_attn().flash_attn_varlen_func
    cu_seqlens_q = cu_seqlens_q.to(torch.int32)
    seq_lens = seq_lens.to(torch.int32)
    cu_seqlens_k = F.pad(seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
    q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    if max_lens is None:  # a caller without the host lengths: read them back (one sync)
        max_lens = torch.stack([q_lens.max(), seq_lens.max()]).tolist()
    max_seqlen_q, max_seqlen_k = max_lens
    return flash_attn_varlen_func(
        q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        softmax_scale=scale, causal=True, window_size=_window_size(window), block_table=block_tables.to(torch.int32),
    )


def paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale, window=None):
    """One query token per sequence: q `[B, Hq, D]`; contract as in `reference.paged_decode_attention`."""
    _check_block_size(k_cache)
    flash_attn_with_kvcache = _flash_attn().flash_attn_with_kvcache
    out = flash_attn_with_kvcache(
        q.unsqueeze(1), k_cache, v_cache, cache_seqlens=seq_lens.to(torch.int32),
        block_table=block_tables.to(torch.int32), softmax_scale=scale, causal=True,
        window_size=_window_size(window),
    )
    return out.squeeze(1)


def _window_size(window):
    """flash-attn's (left, right): query i sees keys i - left .. i + right; our window W means keys
    (p - W, p], so left = W - 1 (and right 0, which causal implies). (-1, -1): no window."""
    return (-1, -1) if window is None else (window - 1, 0)


def _check_block_size(k_cache):
    block_size = k_cache.shape[1]
    if block_size % PAGE_MULTIPLE:
        raise ValueError(
            f"attention_backend='flash_attn' needs a KV cache block size that is a multiple of "
            f"{PAGE_MULTIPLE} (flash-attn's paged mode); this cache has block_size={block_size}. "
            f"Build the engine with block_size={PAGE_MULTIPLE}, or use attention_backend='triton'.")


def _flash_attn():
    try:
        import flash_attn
    except ImportError as e:
        raise RuntimeError("attention_backend='flash_attn' needs flash-attn "
                           "(pip install 'byzantium[flash]')") from e
    return flash_attn
