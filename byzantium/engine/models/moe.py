"""Qwen3-MoE's sparse feed-forward block: a router picks each token's top-k experts, each a SwiGLU MLP.

The experts are stacked (w13 [E, 2I, H]: gate rows then up rows, as transformers 5 fuses them; w2
[E, H, I]) so that one kernels.moe.fused_moe call runs all of them; the router is an nn.Linear and is
packed on the CPU like every other linear, the experts stay plain tensors.
"""
import torch
from torch import nn

from ...kernels.moe import fused_moe


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
        self.w13 = nn.Parameter(torch.empty(experts, 2 * inter, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, inter))

    def forward(self, x):
        # Softmax over all experts in fp32, then top-k (renormalised if the config says so): transformers'
        # router, so the same experts win.
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return fused_moe(x, self.w13, self.w2, weights.to(x.dtype), ids)
