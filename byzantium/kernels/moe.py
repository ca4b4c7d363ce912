"""Mixture-of-experts feed-forward: every token through its top-k experts, summed with its routing weights.

    out = fused_moe(x, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None)

x [T, H]; w13 [E, 2I, H] (each expert's gate rows, then its up rows); w2 [E, H, I]; topk_weights,
topk_ids [T, k]. For token t and each of its k choices e = topk_ids[t, j]:
out[t] += topk_weights[t, j] * w2[e] @ (silu(w13[e, :I] @ x[t]) * (w13[e, I:] @ x[t])).

FP8 experts (engine/quantization.py): w13, w2 in float8_e4m3fn with fp32 scales per (expert, output row),
w13_scale [E, 2I] and w2_scale [E, H]; the real weight is w13[e, r] * w13_scale[e, r].

The experts are stacked tensors, so one call serves all of them: on CUDA the Triton kernels of
`triton_moe.py` (a grouped GEMM over tokens sorted by expert; FP8 tiles converted as they are loaded and
the scales applied to the accumulators; on GPUs older than sm_89, which Triton gives no e4m3, the layer's
experts dequantized for the call: a transient of the layer's local experts in x's dtype, 4.0 GB a layer
for Llama-4-Scout's 16 experts in bf16), elsewhere `moe_reference`.
"""
import importlib.util

import torch
import torch.nn.functional as F


def fused_moe(x, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None):
    if x.is_cuda and importlib.util.find_spec("triton") is not None:
        from .triton_moe import fp8_conversions, fused_moe_triton
        if w13_scale is not None and not fp8_conversions(x.device):  # a GPU older than sm_89: no e4m3 in Triton
            w13, w2 = dequantize_experts(w13, w13_scale, x.dtype), dequantize_experts(w2, w2_scale, x.dtype)
            w13_scale = w2_scale = None
        return fused_moe_triton(x, w13, w2, topk_weights, topk_ids, w13_scale=w13_scale, w2_scale=w2_scale)
    return moe_reference(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)


def moe_reference(x, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None):
    """The CPU path and the oracle: the (token, choice) pairs grouped by expert, each expert that has any
    run once on just its tokens. transformers' own loop, op for op, so the sums round the same way. FP8
    experts are dequantized to x's dtype one at a time, only those that have tokens."""
    num_tokens, top_k = topk_ids.shape
    inter = w2.shape[-1]
    out = torch.zeros_like(x)
    pairs = topk_ids.reshape(-1)
    order = torch.argsort(pairs, stable=True)  # pair p = token p // k, choice p % k
    weights = topk_weights.reshape(-1)
    start = 0
    for e, count in enumerate(torch.bincount(pairs, minlength=w13.shape[0]).tolist()):
        if count == 0:
            continue
        chosen = order[start:start + count]
        start += count
        tokens = chosen // top_k
        gate_up = F.linear(x[tokens], expert_weight(w13, w13_scale, e, x.dtype))
        y = F.linear(F.silu(gate_up[:, :inter]) * gate_up[:, inter:],
                     expert_weight(w2, w2_scale, e, x.dtype)) * weights[chosen, None]
        out.index_add_(0, tokens, y.to(out.dtype))
    return out


def expert_weight(w, scale, e, dtype):
    """Expert e of stacked weights `w` in `dtype`: as it is, or (FP8) w[e] * scale[e] per row, the product
    in fp32 rounded once to `dtype` (as layers/fp8.py dequantizes)."""
    if scale is None:
        return w[e]
    return w[e].float().mul_(scale[e, :, None]).to(dtype)


def dequantize_experts(w, scale, dtype):
    """All of stacked FP8 weights `w` [E, R, C] in `dtype`, an expert at a time (an fp32 transient of one
    expert): the CUDA path on GPUs without e4m3 in Triton."""
    out = torch.empty(w.shape, dtype=dtype, device=w.device)
    for e in range(w.shape[0]):
        out[e] = expert_weight(w, scale, e, dtype)
    return out
