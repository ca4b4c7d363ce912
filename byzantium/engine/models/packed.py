"""CPU fp32 linears with weights prepacked for oneDNN (the path torch.compile's CPU freezing takes).

Measured on our 2-core machines, streaming weights as a model does: prepacked oneDNN linear reads
weights at 14 GB/s at batch 1 where `F.linear` reaches 9, and gives 75 vs 58 GFLOP/s at batch 32
(bench/engine_throughput.py shows the effect on whole decode steps). Without the small-batch kernel the
original weight is dropped after packing. With it, steps of up to MAX_ROWS rows read the original
row-major weight, so both layouts are kept while the linears' weights total at most BOTH_LAYOUTS_BYTES;
a larger model keeps only the original and runs larger steps through `F.linear`, so memory never doubles
for a model that could not afford it.
"""
import torch
import torch.nn.functional as F
from torch import nn

from ...kernels.cpu_ext import MAX_ROWS

BATCH_HINT = 32  # oneDNN picks its blocking for this batch; measured best across batch 1..512
BOTH_LAYOUTS_BYTES = 2 * 2**30


def packing_available(device, dtype):
    if device.type != "cpu" or dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.ones(4, 4), BATCH_HINT)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 4), packed, None, "none", [], "")
        return bool(torch.all(out == 4))
    except (AttributeError, RuntimeError):  # private ops: absent or broken on some builds
        return False


class PackedLinear(nn.Module):
    def __init__(self, linear, small=None, pack=True):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT) if pack else None
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.small = small  # kernels/cpu_gemv.cpp: small batches straight from the row-major weight
        self.weight = weight if small is not None or not pack else None

    def forward(self, x):
        if self.small is not None and x.shape[0] <= MAX_ROWS:
            return self.small.small_linear(x, self.weight, self.bias)
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model, small=None):
    """Replace every nn.Linear of `model` by a PackedLinear (call after the weights are loaded).
    `small`: the compiled small-batch kernel (kernels.cpu_ext.load()), which needs the plain weights."""
    linears = [(module, name, child) for module in model.modules() for name, child in module.named_children()
               if isinstance(child, nn.Linear)]
    total = sum(child.weight.numel() * child.weight.element_size() for _, _, child in linears)
    pack = small is None or total <= BOTH_LAYOUTS_BYTES
    for module, name, child in linears:
        setattr(module, name, PackedLinear(child, small, pack))
    return model
