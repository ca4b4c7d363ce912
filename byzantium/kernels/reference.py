"""Attention over the paged KV cache in plain torch: the CPU path and the oracle for the Triton kernels.

Cache layout (per layer): k_cache, v_cache `[num_blocks, block_size, num_kv_heads, head_dim]`; the
token at position p of a sequence lives in slot `block_table[p // block_size] * block_size +
p % block_size`. GQA: query head h reads KV head `h // (Hq // Hkv)`. Slots past a sequence's length
may hold anything (NaN included) and are never allowed to leak into the result.

Sliding window: with `window=W` (None: global attention) the query at position p attends to the keys at
positions (p - W, p], as transformers' sliding-window layers do. The cache still holds every token of the
sequence (nothing is freed outside the window); only the keys inside it are read.

Chunked attention (Llama 4's local layers): with `chunk=C` (None: none) the query at position p attends to
the keys of its own chunk up to itself, [p // C * C, p]. Like the window, only those keys are read.

An FP8 cache (kv_cache_dtype="fp8": float8_e4m3fn) holds K/V at scale 1 (cast_for_cache) and is read
back in the query's dtype.

Every layer of a step calls these with the same metadata tensors, so what depends only on the
metadata (gather indices, masks) is computed once per step and reused (a one-entry memo keyed on
the metadata tensors themselves).
"""
import torch
import torch.nn.functional as F

CHUNKED_ATTENTION = True  # takes `chunk` (layers/attention.py asks before passing it)
FP8_KV = torch.float8_e4m3fn
_memo = {}


def cast_for_cache(x, cache):
    """K or V as `cache` stores them: an FP8 cache at scale 1 (vLLM's default without checkpoint K/V scales),
    clamped to e4m3's +-448 (bf16 K/V rarely come near it, and past it a cast gives NaN on CUDA)."""
    if x.dtype == cache.dtype:
        return x
    return (x.clamp(-448.0, 448.0) if cache.dtype == FP8_KV else x).to(cache.dtype)


def _gather(flat_cache, slots, dtype):
    """Rows `slots` of a [slots, H, D] cache in `dtype`; FP8 gathered as bytes (index ops lack FP8 kernels)."""
    if flat_cache.dtype == FP8_KV:
        return flat_cache.view(torch.uint8).index_select(0, slots).view(FP8_KV).to(dtype)
    return flat_cache.index_select(0, slots)


def per_step(name, key, make):
    """make() once for as long as `key` (a tuple of tensors) is the same objects as last time."""
    hit = _memo.get(name)
    if hit is not None and len(hit[0]) == len(key) and all(a is b for a, b in zip(hit[0], key)):
        return hit[1]
    value = make()
    _memo[name] = (key, value)
    return value


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    """Write k, v `[T, Hkv, D]` into the cache slots `slot_mapping[T]`; slot -1 means skip."""
    keep = per_step("store", (slot_mapping,), lambda: None if bool((slot_mapping >= 0).all()) else slot_mapping >= 0)
    if keep is not None:
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k, v = cast_for_cache(k, k_cache), cast_for_cache(v, v_cache)
    if k_cache.dtype == FP8_KV:  # index_copy_ has no FP8 kernel: copy the bytes
        k, v, k_cache, v_cache = (t.view(torch.uint8) for t in (k, v, k_cache, v_cache))
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def _token_slots(block_tables, lengths, block_size):
    """Flat slot index of every token position [B, max_len], and validity [B, max_len]. Positions past
    a sequence's length point at its first slot (always written, so finite) and are masked anyway."""
    max_len = int(lengths.max())
    pos = torch.arange(max_len, device=block_tables.device)
    num_blocks = -(-max_len // block_size)
    table = block_tables[:, :num_blocks].long()
    slots = (table[:, :, None] * block_size + torch.arange(block_size, device=table.device)).flatten(1)[:, :max_len]
    valid = pos[None, :] < lengths[:, None]
    return torch.where(valid, slots, slots[:, :1]), valid


def _window_slots(block_tables, lengths, block_size, window, chunk=None):
    """As _token_slots, over the keys each sequence's last query sees only: its last `window` positions,
    or with `chunk` those of its last chunk: [B, the smaller of window and chunk]. Sequences shorter than
    that are padded (their slots past the length point at their first slot, masked)."""
    lengths = lengths.long()
    first = torch.zeros_like(lengths) if window is None else (lengths - window).clamp(min=0)
    if chunk is not None:
        first = torch.maximum(first, (lengths - 1).clamp(min=0) // chunk * chunk)
    width = min(w for w in (window, chunk) if w is not None)
    pos = first[:, None] + torch.arange(width, device=block_tables.device)
    valid = pos < lengths[:, None]
    pos = torch.where(valid, pos, first[:, None])
    blocks = block_tables.long().gather(1, pos // block_size)
    return blocks * block_size + pos % block_size, valid


def append_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, window=None,
                             max_lens=None, chunk=None):
    """Causal attention of new tokens over their sequence's cached prefix plus themselves.

    q `[T, Hq, D]` packs the new tokens of all sequences (`cu_seqlens_q`, length B+1); `seq_lens[b]` is
    sequence b's total length with the new tokens' K/V already stored, so new token j of sequence b
    sits at position `seq_lens[b] - q_len_b + j`. `window`, `chunk`: see the module docstring. Returns `[T, Hq, D]`.
    `max_lens` (the longest new-token run and sequence, host ints) is for backends that size their
    grid with them (flash-attn); the others take and ignore it.
    """
    num_kv_heads, head_dim = k_cache.shape[-2:]
    # One memo per window: a model interleaving sliding and global layers alternates between two plans.
    plan = per_step(f"prefill-{window}-{chunk}", (cu_seqlens_q, seq_lens, block_tables),
                     lambda: _prefill_plan(cu_seqlens_q, seq_lens, block_tables, k_cache.shape[1], window, chunk))
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    out = torch.empty_like(q)
    for start, end, slots, mask in plan:
        # 4-D [1, H, L, D]: with 3-D inputs torch's CPU SDPA takes its slow math path.
        k = _gather(flat_k, slots, q.dtype).transpose(0, 1)[None]  # [1, Hkv, L, D]
        v = _gather(flat_v, slots, q.dtype).transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(q[start:end].transpose(0, 1)[None], k, v, attn_mask=mask, scale=scale,
                                           is_causal=mask is None, enable_gqa=True)
        out[start:end] = o[0].transpose(0, 1)
    return out


def _prefill_plan(cu_seqlens_q, seq_lens, block_tables, block_size, window=None, chunk=None):
    """Per sequence: its query rows, the slots of its keys, and its causal mask."""
    plan = []
    starts, lengths = cu_seqlens_q.tolist(), seq_lens.tolist()
    for b, total in enumerate(lengths):
        start, end = starts[b], starts[b + 1]
        if end == start:
            continue
        slots, _ = _token_slots(block_tables[b:b + 1], seq_lens[b:b + 1], block_size)
        first_query = total - (end - start)
        # Keys before the first query's window (or chunk) are seen by no query: not read at all.
        first_key = 0 if window is None else max(0, first_query - window + 1)
        if chunk is not None:
            first_key = max(first_key, first_query // chunk * chunk)
        # Bottom-right aligned causal mask: new token j sees keys up to position total - q_len + j (and,
        # with a window, from position total - q_len + j - window + 1). With no cached prefix and no
        # window in reach that is SDPA's own causal mask (mask None), which is faster.
        mask = None
        if first_query > 0 or (window is not None and total > window) or (chunk is not None and total > chunk):
            query_pos = torch.arange(first_query, total, device=slots.device)[:, None]
            key_pos = torch.arange(first_key, total, device=slots.device)[None, :]
            mask = key_pos <= query_pos
            if window is not None:
                mask &= key_pos > query_pos - window
            if chunk is not None:
                mask &= key_pos >= query_pos // chunk * chunk
        plan.append((start, end, slots[0, first_key:], mask))
    return plan


def paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale, window=None, chunk=None):
    """One query token per sequence: q `[B, Hq, D]` over each sequence's first seq_lens[b] tokens (its
    last `window` of them when a window is given, those of its last chunk with `chunk`)."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    slots, mask = per_step(f"decode-{window}-{chunk}", (seq_lens, block_tables),
                            lambda: _decode_plan(seq_lens, block_tables, k_cache.shape[1], window, chunk))
    # index_select, not advanced indexing: the latter takes a slow per-element path on CPU.
    shape = (batch, -1, num_kv_heads, head_dim)
    k = _gather(k_cache.view(-1, num_kv_heads, head_dim), slots, q.dtype).view(shape).transpose(1, 2)  # [B, Hkv, L, D]
    v = _gather(v_cache.view(-1, num_kv_heads, head_dim), slots, q.dtype).view(shape).transpose(1, 2)
    # The query heads of one KV head act as that head's "query rows": GQA without repeating K/V.
    qg = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(batch, num_heads, head_dim)


def _decode_plan(seq_lens, block_tables, block_size, window=None, chunk=None):
    reach = min((w for w in (window, chunk) if w is not None), default=None)  # keys a query may see at most
    if reach is not None and int(seq_lens.max()) > reach:
        slots, valid = _window_slots(block_tables, seq_lens, block_size, window, chunk)
    else:
        slots, valid = _token_slots(block_tables, seq_lens, block_size)
    # Sequences of equal length (a batch decoding in lockstep, or one sequence) need no mask.
    return slots.flatten(), None if bool(valid.all()) else valid[:, None, None, :]
