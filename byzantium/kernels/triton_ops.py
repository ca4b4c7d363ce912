"""Triton kernels for attention over the paged KV cache: the CUDA path.

Same three functions, signatures and cache layout as `reference.py` (the oracle they are tested
against): k_cache, v_cache `[num_blocks, block_size, num_kv_heads, head_dim]`.

- `store_kv`: one program per new token scatters its K/V (all heads) into its slot.
- `paged_decode_attention`: flash-decoding. Programs are (sequence, KV head, split): each handles all
  query heads of its KV head together (GQA: K/V are read once per group, not once per query head)
  over one slice of the context, and writes a partial output plus its log-sum-exp; a second kernel
  merges the splits. Splitting keeps the GPU busy when the batch is small and contexts are long.
- `append_prefill_attention`: one kernel for every step that has new tokens (prompt prefill,
  prefix-cache hits, chunked prefill, session extends, q_len 1 rows). A program owns BLOCK_Q query
  tokens of one sequence times the query heads of one KV head (the rows of its tile), as vLLM's
  unified attention does, and streams the sequence's cached keys with an online softmax.

The launch grids depend only on tensor shapes, never on values in device tensors, so no kernel
needs a host sync and decode can be captured in CUDA graphs.

Sliding window (`window=W`; None: global attention): the query at position p sees keys (p - W, p]. Decode
splits only the window's keys; append prefill starts each tile at the first key its first query sees and
masks per row. The cache keeps every token; keys before the window are simply not read.
Chunked attention (`chunk=C`, Llama 4's local layers): the query at position p sees keys [p // C * C, p],
bounded and masked the same way.

An FP8 cache (kv_cache_dtype="fp8") is written as reference.cast_for_cache casts (scale 1, clamped; in
torch, so both backends store the same bytes) and its K/V tiles are converted to the query's dtype as they
are loaded (needs a GPU with FP8 conversions in Triton: compute capability 8.9 or more).

Masking: keys past a sequence's length are never loaded (masked loads give 0) and their scores are
-inf, so unwritten cache slots (which may hold NaN) cannot reach the output. All accumulation is fp32;
softmax uses exp2 with log2(e) folded into the scale.
"""
import functools

import torch
import triton
import triton.language as tl

from .reference import cast_for_cache

_LOG2E = 1.4426950408889634


# ---------------------------------------------------------------------------------------- store_kv

@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    src_k = token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    src_v = token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs \
        + offs_h[:, None] * stride_ch + offs_d[None, :]
    tl.store(k_cache_ptr + dst, tl.load(k_ptr + src_k, mask=mask), mask=mask)
    tl.store(v_cache_ptr + dst, tl.load(v_ptr + src_v, mask=mask), mask=mask)


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    """Write k, v `[T, Hkv, D]` into the cache slots `slot_mapping[T]`; slot -1 means skip."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    k, v = _last_dim_contiguous(cast_for_cache(k, k_cache)), _last_dim_contiguous(cast_for_cache(v, v_cache))
    _check_cache(k_cache, v_cache)
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )


@triton.jit
def _like(x, q):
    """K or V as q's dtype; an FP8 cache through fp32, since Triton 3.6 converts e4m3 to bf16 through f16 with
    a cvt.bf16.f16 that ptxas has only from sm_90 (sm_89, where FP8 starts, would not compile)."""
    if x.dtype.is_fp8():
        x = x.to(tl.float32)
    return x.to(q.dtype)


# ------------------------------------------------------------------------------------ decode (split-K)

@triton.jit
def _split_range(seq_len, window, chunk, split, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Token range [start, end) of one split of the keys the query sees, [seq_len - window, seq_len)
    and from the start of its chunk, clipped at 0. Splits are whole BLOCK_N tiles, so trailing ones may
    be empty; both decode kernels call this, so they agree on which splits wrote a result."""
    first = tl.maximum(tl.maximum(seq_len - window, tl.maximum(seq_len - 1, 0) // chunk * chunk), 0)
    split_len = tl.cdiv(tl.cdiv(seq_len - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split * split_len
    end = tl.minimum(start + split_len, seq_len)
    return start, end


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, seq_lens_ptr, block_tables_ptr,
    out_ptr, mid_o_ptr, mid_lse_ptr, qk_scale, window, chunk,
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    stride_mid_b, stride_mid_h, stride_mid_s, stride_lse_b, stride_lse_h,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # Rows are the GROUP query heads sharing this KV head, padded to BLOCK_H (>= 16 for tl.dot).
    offs_h = kv_head * GROUP + tl.arange(0, BLOCK_H)
    mask_h = tl.arange(0, BLOCK_H) < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_o = mask_h[:, None] & mask_d[None, :]
    out_offs = seq * stride_ob + offs_h[:, None] * stride_oh + offs_d[None, :]

    seq_len = tl.load(seq_lens_ptr + seq)
    start, end = _split_range(seq_len, window, chunk, split, NUM_SPLITS, BLOCK_N)
    if start >= end:
        if NUM_SPLITS == 1:  # an empty sequence (a padding row): zeros, as the merge kernel gives
            tl.store(out_ptr + out_offs, tl.zeros([BLOCK_H, BLOCK_D], out_ptr.dtype.element_ty), mask=mask_o)
        return

    q = tl.load(q_ptr + seq * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        # Gather per token through the block table: works for any block_size / BLOCK_N ratio.
        block = tl.load(table + offs_n // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
        kv_offs = block * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        k = _like(tl.load(k_cache_ptr + kv_offs[None, :] + offs_d[:, None],
                          mask=mask_n[None, :] & mask_d[:, None], other=0.0), q)  # [D, N]; an FP8 cache upcast
        qk = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        # Online softmax (base 2). Every tile has >= 1 valid key, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _like(tl.load(v_cache_ptr + kv_offs[:, None] + offs_d[None, :],
                          mask=mask_n[:, None] & mask_d[None, :], other=0.0), q)  # [N, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / l_i[:, None]
    if NUM_SPLITS == 1:  # nothing to merge: write the output directly and skip the second kernel
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=mask_o)
    else:
        mid = seq * stride_mid_b + offs_h * stride_mid_h + split * stride_mid_s
        tl.store(mid_o_ptr + mid[:, None] + offs_d[None, :], acc, mask=mask_o)
        tl.store(mid_lse_ptr + seq * stride_lse_b + offs_h * stride_lse_h + split,
                 m_i + tl.log2(l_i), mask=mask_h)  # log2-sum-exp2 of the scaled scores


@triton.jit
def _decode_merge_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr, seq_lens_ptr, window, chunk,
    stride_mid_b, stride_mid_h, stride_mid_s, stride_lse_b, stride_lse_h, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mid_o_ptr += seq * stride_mid_b + head * stride_mid_h
    mid_lse_ptr += seq * stride_lse_b + head * stride_lse_h

    m = tl.full([], float("-inf"), tl.float32)
    weight_sum = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for split in range(NUM_SPLITS):
        start, end = _split_range(seq_len, window, chunk, split, NUM_SPLITS, BLOCK_N)
        if start < end:  # empty splits wrote nothing
            o = tl.load(mid_o_ptr + split * stride_mid_s + offs_d, mask=mask_d, other=0.0)
            lse = tl.load(mid_lse_ptr + split)
            m_new = tl.maximum(m, lse)
            alpha = tl.exp2(m - m_new)
            w = tl.exp2(lse - m_new)
            acc = acc * alpha + w * o
            weight_sum = weight_sum * alpha + w
            m = m_new
    # weight_sum >= 1 once any split ran (the largest lse contributes exp2(0)); the clamp only keeps
    # an empty sequence (a padding row) at 0 instead of 0/0.
    acc = acc / tl.maximum(weight_sum, 1.0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + offs_d,
             acc.to(out_ptr.dtype.element_ty), mask=mask_d)


def paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale, window=None, chunk=None, *,
                           num_splits=None):
    """One query token per sequence: q `[B, Hq, D]` over each sequence's first seq_lens[b] tokens (its
    last `window` of them when a window is given, those of its last chunk of `chunk` tokens when chunked).

    `num_splits` (how many programs share one sequence's context) defaults to a choice from the
    shapes alone; pass it to force one (tests do). Rows with seq_lens 0 (padding rows) come out as zeros.
    """
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    if batch == 0:
        return out
    q = _last_dim_contiguous(q)
    _check_cache(k_cache, v_cache)
    # Keys per tile: fp32 tiles of 64 keys spill registers past head dim 64 on sm_80/sm_90
    # (bench/results/triton_aot.md); 16 is tl.dot's minimum.
    block_n = 64 if q.dtype != torch.float32 or head_dim <= 64 else 16
    if head_dim < 16:  # padded to 16 dims: 64-key tiles of them spill 8 bytes on sm_90 (Triton 3.9)
        block_n = 32
    if k_cache.dtype.itemsize == 1 and head_dim > 128:  # FP8 tiles upcast to 256 dims: 64 keys spill under
        block_n = 32                                     # Triton 3.6 (sm_90 and sm_89)
    if num_splits is None:
        context = block_tables.shape[1] * block_size
        num_splits = _decode_num_splits(batch, num_kv_heads, min(context, window or context, chunk or context),
                                        q.device)
    block_d = _block_d(head_dim)
    if num_splits > 1:
        # Per split: partial output [B, Hq, S, D] (already divided by its own softmax sum) and its
        # log-sum-exp [B, Hq, S], both fp32.
        mid_o = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        mid_o = mid_lse = out  # unused: the first kernel writes the output itself
    mid_strides = (num_heads * num_splits * head_dim, num_splits * head_dim, head_dim,
                   num_heads * num_splits, num_splits)
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, seq_lens, block_tables,
        out, mid_o, mid_lse, scale * _LOG2E, _window_arg(window), _window_arg(chunk),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        *mid_strides,
        GROUP=group, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_D=block_d, BLOCK_N=block_n,
        NUM_SPLITS=num_splits, DOT_PRECISION=_dot_precision(q.dtype),
    )
    if num_splits > 1:
        _decode_merge_kernel[(batch, num_heads)](
            mid_o, mid_lse, out, seq_lens, _window_arg(window), _window_arg(chunk), *mid_strides, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=block_n, NUM_SPLITS=num_splits,
        )
    return out


def _decode_num_splits(batch, num_kv_heads, max_context, device):
    """Enough programs to fill the GPU about twice, at least 256 tokens a split, a power of two
    (fewer compiled variants). Uses only shapes, so a captured CUDA graph stays valid."""
    if device.type != "cuda":
        return 1
    wanted = triton.cdiv(2 * _num_sms(device.index), batch * num_kv_heads)
    splits = min(wanted, triton.cdiv(max_context, 256), 64)
    return 1 if splits <= 1 else triton.next_power_of_2(splits)


@functools.cache
def _num_sms(index):
    return torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index).multi_processor_count


# ------------------------------------------------------------------------------------ append prefill

@triton.jit
def _find_seq(cu_seqlens_q_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """Sequence owning q_block. Sequence b's q blocks are numbered from cu_seqlens_q[b] // BLOCK_Q + b:
    an upper bound of the blocks before it, computable without a host sync; binary search."""
    lo: tl.int32 = 0  # typed: loop-carried, and num_seqs == 1 may arrive as a constant
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _append_prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_tables_ptr,
    qk_scale, num_seqs, window, chunk,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_seq(cu_seqlens_q_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= q_len:  # spare program from the upper-bound grid
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - q_len  # cached tokens before the new ones

    # Row r of the tile is query token r // GROUP (of this block) and query head r % GROUP of this
    # KV head: all heads of a group share each K/V tile, and q_len 1 rows still fill the tile.
    offs_m = tl.arange(0, BLOCK_M)
    token = local_block * BLOCK_Q + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    mask_m = (offs_m < BLOCK_Q * GROUP) & (token < q_len)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q_offs = (q_start + token).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    q_pos = prefix_len + token  # bottom-right causal alignment: new token j sits at prefix_len + j

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # Causal: no row of this tile sees past the tile's last token, so stop there; nor before the window
    # or the chunk of its first token.
    kv_end = tl.minimum(seq_len, prefix_len + (local_block + 1) * BLOCK_Q)
    first_pos = prefix_len + local_block * BLOCK_Q
    kv_start = tl.maximum(tl.maximum(first_pos - window + 1, first_pos // chunk * chunk), 0)
    for n0 in range(kv_start, kv_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < kv_end
        block = tl.load(table + offs_n // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
        kv_offs = block * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        k = _like(tl.load(k_cache_ptr + kv_offs[None, :] + offs_d[:, None],
                          mask=mask_n[None, :] & mask_d[:, None], other=0.0), q)  # [D, N]; an FP8 cache upcast
        qk = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
        visible = ((offs_n[None, :] <= q_pos[:, None]) & (offs_n[None, :] > q_pos[:, None] - window)
                   & (offs_n[None, :] >= q_pos[:, None] // chunk * chunk))
        qk = tl.where(mask_n[None, :] & visible, qk, float("-inf"))
        # With a window (or a chunk start) inside the tile, a row may see no key of a tile (its m_new stays -inf):
        # subtract 0 then, so its p and alpha are 0 rather than NaN. Every row sees its own key later.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _like(tl.load(v_cache_ptr + kv_offs[:, None] + offs_d[None, :],
                          mask=mask_n[:, None] & mask_d[None, :], other=0.0), q)  # [N, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / l_i[:, None]
    o_offs = (q_start + token).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_offs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def append_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, window=None,
                             max_lens=None, chunk=None, *, block_m=None):
    """Causal attention of new tokens over their sequence's cached prefix plus themselves.

    q `[T, Hq, D]` packs the new tokens of all sequences (`cu_seqlens_q`, length B+1); `seq_lens[b]`
    is sequence b's total length with the new tokens' K/V already stored; `window` as in the module
    docstring. Returns `[T, Hq, D]`.
    `block_m` (rows of a tile: query tokens x heads of a group) defaults to a choice from the shapes.
    """
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    num_seqs = seq_lens.shape[0]
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    q = _last_dim_contiguous(q)
    _check_cache(k_cache, v_cache)
    if block_m is None:
        # Rows one sequence needs on average: decode-heavy batches want small tiles (few wasted
        # rows), long prompts want large ones (tensor-core efficiency, fewer K/V re-reads).
        rows = group * max(1, num_tokens // max(num_seqs, 1))
        block_m = 16 if rows <= 16 else 64 if rows <= 64 else 128
        if head_dim > 128:  # 128 rows x 256 dims spill registers and need ~197 KB of shared memory (sm_90)
            block_m = min(block_m, 64)
        if group & (group - 1):  # a group of 3, 5, 6: 128 rows of whole groups (42 tokens x 3) spill on
            block_m = min(block_m, 64)  # sm_89 and sm_80 (the row-to-token division costs registers)
        if q.dtype == torch.float32:  # fp32 dots run without tensor cores and need far more shared
            block_m = 16              # memory: 64 rows would not fit on consumer GPUs (~100 KB)
    block_m = max(block_m, triton.next_power_of_2(group))
    block_q = block_m // group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)  # upper bound; see _find_seq
    _append_prefill_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, seq_lens, block_tables,
        scale * _LOG2E, num_seqs, _window_arg(window), _window_arg(chunk),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_D=_block_d(head_dim),
        BLOCK_N=_prefill_block_n(q.dtype, head_dim, fp8_cache=k_cache.dtype.itemsize == 1),
        DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=_prefill_warps(block_m, _block_d(head_dim)),  # the padded tile's width decides
    )
    return out


# ------------------------------------------------------------------------------------------ helpers

def _block_d(head_dim):
    # tl.dot needs K >= 16 (the interpreter does not check): smaller head dims are padded, masked lanes zero
    return max(16, triton.next_power_of_2(head_dim))


def _prefill_warps(block_m, head_dim):
    return 8 if block_m >= 128 or (block_m >= 64 and head_dim >= 128) else 4  # fewer registers a thread


def _prefill_block_n(dtype, head_dim, fp8_cache=False):
    """Keys per tile, chosen so that no (dtype, head dim) spills registers on sm_80, sm_89 or sm_90 under
    Triton 3.6 and 3.9 (bench/results/triton_aot.md): 64, fewer past head dim 128 or from head dim 128 over
    an FP8 cache (its upcast tiles), and fp32 (16-row tiles, no tensor cores) fewer as the head dim grows,
    at least tl.dot's 16."""
    if dtype != torch.float32:
        return 64 if head_dim <= (64 if fp8_cache else 128) else 32
    return max(16, min(64, 4096 // triton.next_power_of_2(head_dim)))


def _window_arg(window):
    # None (global) as a window (or chunk) longer than any sequence: one compiled kernel serves every kind
    # of layer.
    return _NO_WINDOW if window is None else int(window)


_NO_WINDOW = 1 << 30
CHUNKED_ATTENTION = True  # takes `chunk` (layers/attention.py asks before passing it)


def _dot_precision(dtype):
    # fp32 inputs would default to TF32 on NVIDIA GPUs (~1e-3 error); keep fp32 exact. fp16/bf16:
    # the backend's default (None).
    return "ieee" if dtype == torch.float32 else None


def _last_dim_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_cache(k_cache, v_cache):
    # The kernels index the cache with k_cache's strides and a unit stride over head_dim.
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must share strides and be contiguous over head_dim")
