"""CPU fp32 linears with weights prepacked for oneDNN (the path torch.compile's CPU freezing takes).

Measured on our 2-core machines, streaming weights as a model does: prepacked oneDNN linear reads
weights at 14 GB/s at batch 1 where `F.linear` reaches 9, and gives 75 vs 58 GFLOP/s at batch 32
(bench/engine_throughput.py shows the effect on whole decode steps). The original weight is dropped
after packing, so memory does not double.
"""
import torch
from torch import nn

from ...kernels.cpu_ext import MAX_ROWS

BATCH_HINT = 32  # oneDNN picks its blocking for this batch; measured best across batch 1..512


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
    def __init__(self, linear, small=None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), BATCH_HINT))
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.small = small  # kernels/cpu_gemv.cpp: small batches straight from the row-major weight
        self.weight = linear.weight.detach() if small is not None else None

    def forward(self, x):
        if self.small is not None and x.shape[0] <= MAX_ROWS:
            return self.small.small_linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model, small=None):
    """Replace every nn.Linear of `model` by a PackedLinear (call after the weights are loaded).
    `small`: the compiled small-batch kernel (kernels.cpu_ext.load()), which keeps the plain weights too."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, PackedLinear(child, small))
    return model
