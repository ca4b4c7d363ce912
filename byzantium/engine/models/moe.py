"""Qwen3-MoE's sparse feed-forward block: a router picks each token's top-k experts, each a SwiGLU MLP.

The experts are stacked (w13 [E, 2I, H]: gate rows then up rows, as transformers 5 fuses them; w2
[E, H, I]) so that one kernels.moe.fused_moe call runs all of them; the router is an nn.Linear and is
packed on the CPU like every other linear, the experts stay plain tensors.

Under tensor parallelism each rank holds a share of the experts, whole (parallel.experts_of_rank): it runs
the tokens routed to its own, and the block's output is summed over ranks.

FP8 experts (engine/quantization.py swaps them in on meta: use_fp8_experts): w13/w2 in float8_e4m3fn with
fp32 scales per (expert, output row), w13_scale [E, 2I] and w2_scale [E, H]; loaded an expert at a time
(engine/weights.py: stacked, or one checkpoint tensor per expert and projection), each quantized per row as it is read
unless the checkpoint stores it in FP8 with its scales. llama4.py's MoeBlock has the same layout.
"""
import torch
from torch import nn

from ...kernels.moe import fused_moe
from ..layers import parallel
from ..layers.fp8 import FP8

EXPERT_WEIGHTS = ("w13", "w2")
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # per-expert checkpoint linears


def use_fp8_experts(block):
    """Make a MoE block's stacked experts FP8, on the device they are on (meta while the model is built,
    after model.to(dtype), which would cast them): w13/w2 e4m3 of the same shape and their fp32 row scales."""
    for name in EXPERT_WEIGHTS:
        w = getattr(block, name)
        setattr(block, name, nn.Parameter(torch.empty(w.shape, dtype=FP8, device=w.device), requires_grad=False))
        setattr(block, f"{name}_scale", nn.Parameter(torch.empty(w.shape[:2], dtype=torch.float32, device=w.device),
                                                     requires_grad=False))


def is_sparse_layer(config, index):
    """Whether decoder layer `index` has the MoE block (transformers' rule) or a dense MLP."""
    return (index not in (getattr(config, "mlp_only_layers", None) or []) and config.num_experts > 0
            and (index + 1) % config.decoder_sparse_step == 0)


class SparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        if config.hidden_act not in ("silu", "swish"):
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r}: the experts are SwiGLU (silu)")
        experts, hidden, inter = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, bool(config.norm_topk_prob)
        self.inter = inter
        self.gate = nn.Linear(hidden, experts, bias=False)  # the router (checkpoint name mlp.gate)
        self.tp = parallel.current()
        self.num_experts = experts
        self.experts = parallel.experts_of_rank(experts)  # the ids of this rank's experts
        self.w13 = nn.Parameter(torch.empty(len(self.experts), 2 * inter, hidden))
        self.w2 = nn.Parameter(torch.empty(len(self.experts), hidden, inter))
        self.register_parameter("w13_scale", None)  # FP8 experts' row scales (use_fp8_experts)
        self.register_parameter("w2_scale", None)

    def forward(self, x):
        # Softmax over all experts in fp32, then top-k (renormalised if the config says so): transformers'
        # router, so the same experts win.
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        scales = dict(w13_scale=self.w13_scale, w2_scale=self.w2_scale)
        if self.tp.size == 1:
            return fused_moe(x, self.w13, self.w2, weights, ids, **scales)
        # Choices of another rank's experts weigh 0 here (their id clamped to one of ours, computed in vain).
        local = ids - self.experts.start
        others = (local < 0) | (local >= len(self.experts))
        out = fused_moe(x, self.w13, self.w2, weights.masked_fill(others, 0), local.clamp(0, len(self.experts) - 1),
                        **scales)
        return parallel.all_reduce(out, self.tp)
