"""Triton kernels for the mixture-of-experts feed-forward (`moe.fused_moe`'s CUDA path), laid out as vLLM's
fused MoE.

- `align`: the T*k (token, choice) pairs sorted by expert, each expert's run padded to whole BLOCK_M
  tiles, and the expert of every tile. Planned in torch with no host sync: the tile count is an upper
  bound from shapes alone (ceil(T*k / BLOCK_M) + min(E, T*k)); tiles past the end have expert -1 and
  their programs return at once.
- `_w13_kernel`: a grouped GEMM over (tile, column block) programs: a tile's rows of x gathered by token
  times its expert's gate and up rows of w13, SiLU(gate) * up fused into the epilogue.
- `_w2_kernel`: those rows times the expert's w2, scaled by the pair's routing weight.
Each pair writes its own output row, and the k rows of a token are summed at the end: no atomics, so
the result does not depend on scheduling. Accumulation is fp32.

FP8 experts (w13/w2 float8_e4m3fn with fp32 scales per expert and output row): each weight tile is
converted to the activations' dtype as it is loaded (exact: e4m3 values are bf16/fp16/fp32 values) and
the output rows' scales multiply the fp32 accumulators once after the K loop (sum_k x_k * (q_nk * s_n) =
s_n * sum_k x_k * q_nk), so no dequantized copy of the experts exists. Triton converts e4m3 on GPUs of
compute capability 8.9 or more (and in the interpreter); on older GPUs moe.fused_moe dequantizes the
layer's experts to the activations' dtype for the call (moe.dequantize_experts: a transient of the
layer's local experts in that dtype, 4.0 GB a layer for Llama-4-Scout's 16 experts in bf16).
"""
import torch
import triton
import triton.language as tl


def align(topk_ids, num_experts, block_m):
    """(sorted_pairs [tiles * block_m], tile_expert [tiles]): pair indices (into topk_ids.view(-1)) grouped
    by expert, each group padded to whole tiles with the sentinel T*k; the expert of each tile, -1 past the end."""
    pairs = topk_ids.reshape(-1).long()
    n = pairs.numel()
    # scatter_add_, not bincount: bincount reads min/max back to the host on CUDA (two syncs a layer
    # and no CUDA-graph capture); the count is a shape-only kernel this way.
    counts = torch.zeros(num_experts, dtype=torch.long, device=pairs.device).scatter_add_(0, pairs, torch.ones_like(pairs))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(pairs, stable=True)
    expert = pairs[order]
    rank = torch.arange(n, device=pairs.device) - (torch.cumsum(counts, 0) - counts)[expert]
    num_tiles = triton.cdiv(n, block_m) + min(num_experts, n)
    sorted_pairs = torch.full((num_tiles * block_m,), n, dtype=torch.int32, device=pairs.device)
    sorted_pairs[(ends - padded)[expert] + rank] = order.to(torch.int32)
    tile_start = torch.arange(num_tiles, device=pairs.device) * block_m
    tile_expert = torch.searchsorted(ends, tile_start, right=True)  # experts with no pairs own no tile
    tile_expert = torch.where(tile_expert < num_experts, tile_expert, -1).to(torch.int32)
    return sorted_pairs, tile_expert


@triton.jit
def _w13_kernel(
    x_ptr, w_ptr, out_ptr, sorted_ptr, expert_ptr, scale_ptr,
    num_pairs, hidden, inter,
    stride_xt, stride_we, stride_wn, stride_ot, stride_se,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    tile = tl.program_id(0)
    expert = tl.load(expert_ptr + tile).to(tl.int64)
    if expert < 0:
        return
    pairs = tl.load(sorted_ptr + tile * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs  # padding rows of the tile
    tokens = (pairs // TOP_K).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < inter
    w = w_ptr + expert * stride_we
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < hidden
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + offs_k[None, :],
                    mask=valid[:, None] & mask_k[None, :], other=0.0)  # [M, K]
        w_mask = mask_k[:, None] & mask_n[None, :]
        gate = tl.load(w + offs_n[None, :] * stride_wn + offs_k[:, None], mask=w_mask, other=0.0)  # [K, N]
        up = tl.load(w + (inter + offs_n[None, :]) * stride_wn + offs_k[:, None], mask=w_mask, other=0.0)
        if HAS_SCALE:  # FP8 tiles to the activations' dtype (exact), through fp32: see _fp8_to
            gate, up = _fp8_to(gate, a.dtype), _fp8_to(up, a.dtype)
        acc_gate = tl.dot(a, gate, acc_gate, input_precision=DOT_PRECISION)
        acc_up = tl.dot(a, up, acc_up, input_precision=DOT_PRECISION)
    if HAS_SCALE:  # the output rows' scales, once
        scale = scale_ptr + expert * stride_se
        acc_gate = acc_gate * tl.load(scale + offs_n, mask=mask_n, other=0.0)[None, :]
        acc_up = acc_up * tl.load(scale + inter + offs_n, mask=mask_n, other=0.0)[None, :]
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up
    tl.store(out_ptr + pairs[:, None].to(tl.int64) * stride_ot + offs_n[None, :],
             h.to(out_ptr.dtype.element_ty), mask=valid[:, None] & mask_n[None, :])


@triton.jit
def _fp8_to(x, dtype: tl.constexpr):
    """An e4m3 tile as `dtype` through fp32: Triton 3.6 converts e4m3 to bf16 through f16 with a cvt.bf16.f16
    that ptxas has only from sm_90, so on sm_89 (where FP8 starts) the direct conversion does not compile."""
    return x.to(tl.float32).to(dtype)


@triton.jit
def _w2_kernel(
    h_ptr, w_ptr, out_ptr, sorted_ptr, expert_ptr, weight_ptr, scale_ptr,
    num_pairs, hidden, inter,
    stride_ht, stride_we, stride_wn, stride_ot, stride_se,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    tile = tl.program_id(0)
    expert = tl.load(expert_ptr + tile).to(tl.int64)
    if expert < 0:
        return
    pairs = tl.load(sorted_ptr + tile * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    rows = pairs.to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden
    w = w_ptr + expert * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < inter
        a = tl.load(h_ptr + rows[:, None] * stride_ht + offs_k[None, :],
                    mask=valid[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(w + offs_n[None, :] * stride_wn + offs_k[:, None],
                    mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if HAS_SCALE:
            b = _fp8_to(b, a.dtype)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if HAS_SCALE:
        acc = acc * tl.load(scale_ptr + expert * stride_se + offs_n, mask=mask_n, other=0.0)[None, :]
    weight = tl.load(weight_ptr + rows, mask=valid, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & mask_n[None, :])


def fused_moe_triton(x, w13, w2, topk_weights, topk_ids, block_m=None, block_n=None, block_k=32,
                     w13_scale=None, w2_scale=None):
    """Same contract as moe.moe_reference. block_m: rows per tile (default: 16 when experts get few
    tokens, as in decode; 64 for prefill-sized batches); block_n: output columns per tile (default
    64; 32 for fp32, whose 64-column gate/up tiles spill registers on sm_80). FP8 experts (w13_scale,
    w2_scale given): converted in the kernels, which needs fp8_conversions(x.device) (moe.fused_moe
    dequantizes them beforehand where it is False)."""
    num_tokens, top_k = topk_ids.shape
    num_experts, two_inter, hidden = w13.shape
    inter = two_inter // 2
    n = num_tokens * top_k
    if n == 0:
        return torch.zeros_like(x)
    scaled = w13_scale is not None
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    s13, s2 = (w13_scale.contiguous(), w2_scale.contiguous()) if scaled else (w13, w2)  # unread unless scaled
    block_m = block_m or (16 if n < 32 * num_experts else 64)
    block_n = block_n or (32 if x.dtype == torch.float32 else 64)
    sorted_pairs, tile_expert = align(topk_ids, num_experts, block_m)
    num_tiles = tile_expert.numel()
    precision = "ieee" if x.dtype == torch.float32 else None  # fp32 stays fp32 (no TF32) on the GPU
    h = torch.empty(n, inter, dtype=x.dtype, device=x.device)
    _w13_kernel[(num_tiles, triton.cdiv(inter, block_n))](
        x, w13, h, sorted_pairs, tile_expert, s13, n, hidden, inter,
        x.stride(0), w13.stride(0), w13.stride(1), h.stride(0), s13.stride(0),
        TOP_K=top_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_PRECISION=precision,
        HAS_SCALE=scaled,
    )
    out = torch.empty(n, hidden, dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1).contiguous()
    _w2_kernel[(num_tiles, triton.cdiv(hidden, block_n))](
        h, w2, out, sorted_pairs, tile_expert, weights, s2, n, hidden, inter,
        h.stride(0), w2.stride(0), w2.stride(1), out.stride(0), s2.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_PRECISION=precision,
        HAS_SCALE=scaled,
    )
    return out.view(num_tokens, top_k, hidden).sum(1)


_fp8_conversions = {}  # CUDA device index -> whether Triton converts e4m3 there


def fp8_conversions(device):
    """Whether Triton kernels on `device` can load e4m3 tiles and convert them: the interpreter, or a CUDA
    GPU of compute capability >= 8.9 (Triton has no e4m3 on older ones)."""
    if device.type != "cuda":
        return True  # TRITON_INTERPRET=1: tensors on the CPU
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _fp8_conversions:
        _fp8_conversions[index] = torch.cuda.get_device_capability(index) >= (8, 9)
    return _fp8_conversions[index]
