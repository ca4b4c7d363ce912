"""Attention over the paged KV cache in plain torch: the CPU path and the oracle for the Triton kernels.

Cache layout (per layer): k_cache, v_cache `[num_blocks, block_size, num_kv_heads, head_dim]`; the
token at position p of a sequence lives in slot `block_table[p // block_size] * block_size +
p % block_size`. GQA: query head h reads KV head `h // (Hq // Hkv)`. Slots past a sequence's length
may hold anything (NaN included) and are never allowed to leak into the result.
"""
import torch
import torch.nn.functional as F


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    """Write k, v `[T, Hkv, D]` into the cache slots `slot_mapping[T]`; slot -1 means skip."""
    if (slot_mapping < 0).any():
        keep = slot_mapping >= 0
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def _gather(cache, block_table, length):
    """The first `length` tokens of one sequence, `[length, Hkv, D]` (a copy)."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    return cache[block_table[:num_blocks]].flatten(0, 1)[:length]


def append_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale):
    """Causal attention of new tokens over their sequence's cached prefix plus themselves.

    q `[T, Hq, D]` packs the new tokens of all sequences (`cu_seqlens_q`, length B+1); `seq_lens[b]` is
    sequence b's total length with the new tokens' K/V already stored, so new token j of sequence b
    sits at position `seq_lens[b] - q_len_b + j`. Returns `[T, Hq, D]`.
    """
    out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    lengths = seq_lens.tolist()
    for b, total in enumerate(lengths):
        start, end = starts[b], starts[b + 1]
        q_len = end - start
        if q_len == 0:
            continue
        k = _gather(k_cache, block_tables[b], total).transpose(0, 1)  # [Hkv, L, D]
        v = _gather(v_cache, block_tables[b], total).transpose(0, 1)
        # Bottom-right aligned causal mask: new token j sees keys up to position total - q_len + j.
        query_pos = torch.arange(total - q_len, total, device=q.device)
        key_pos = torch.arange(total, device=q.device)
        mask = key_pos[None, :] <= query_pos[:, None]
        qb = q[start:end].transpose(0, 1)  # [Hq, q_len, D]
        o = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start:end] = o.transpose(0, 1)
    return out


def paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale):
    """One query token per sequence: q `[B, Hq, D]` over each sequence's first seq_lens[b] tokens."""
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    table = block_tables[:, :num_blocks]
    # [B, L, Hkv, D] -> [B, Hkv, L, D]; query heads grouped by their KV head so K/V are never repeated.
    k = k_cache[table].flatten(1, 2)[:, :max_len].transpose(1, 2)
    v = v_cache[table].flatten(1, 2)[:, :max_len].transpose(1, 2)
    valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None]  # [B, L]
    v = torch.where(valid[:, None, :, None], v, 0)  # unwritten slots may hold NaN: 0 * NaN = NaN
    scores = torch.matmul(q.view(batch, num_kv_heads, group, head_dim), k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v).view(batch, num_heads, head_dim)
