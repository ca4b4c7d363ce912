"""Mixture-of-experts feed-forward: every token through its top-k experts, summed with its routing weights.

    out = fused_moe(x, w13, w2, topk_weights, topk_ids)

x [T, H]; w13 [E, 2I, H] (each expert's gate rows, then its up rows); w2 [E, H, I]; topk_weights,
topk_ids [T, k]. For token t and each of its k choices e = topk_ids[t, j]:
out[t] += topk_weights[t, j] * w2[e] @ (silu(w13[e, :I] @ x[t]) * (w13[e, I:] @ x[t])).

The experts are stacked tensors, so one call serves all of them: on CUDA the Triton kernels of
`triton_moe.py` (a grouped GEMM over tokens sorted by expert), elsewhere `moe_reference`.
"""
import importlib.util

import torch
import torch.nn.functional as F


def fused_moe(x, w13, w2, topk_weights, topk_ids):
    if x.is_cuda and importlib.util.find_spec("triton") is not None:
        from .triton_moe import fused_moe_triton
        return fused_moe_triton(x, w13, w2, topk_weights, topk_ids)
    return moe_reference(x, w13, w2, topk_weights, topk_ids)


def moe_reference(x, w13, w2, topk_weights, topk_ids):
    """The CPU path and the oracle: the (token, choice) pairs grouped by expert, each expert that has any
    run once on just its tokens. transformers' own loop, op for op, so the sums round the same way."""
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
        gate_up = F.linear(x[tokens], w13[e])
        y = F.linear(F.silu(gate_up[:, :inter]) * gate_up[:, inter:], w2[e]) * weights[chosen, None]
        out.index_add_(0, tokens, y.to(out.dtype))
    return out
