"""CPU fp32 linears with their weights repacked once at load time, for kernels that beat `F.linear` here.

- Byzantium's panel GEMM (kernels/cpu_gemm.cpp), when the CPU kernels build: the weight as panels of 16
  output columns, one kernel for every batch size. Measured on our 2-core machines with the weights
  streamed from memory as a decode step does (`python bench/kernel_bench.py --cpu`): 1.9-2.1x oneDNN at
  1-8 rows, 1.3-1.6x at 16-32, 1.25x at 64, and oneDNN's speed at prefill sizes.
- Otherwise oneDNN's prepacked weights (the path torch.compile's CPU freezing takes): 14 GB/s at batch 1
  where `F.linear` reaches 9, 75 vs 58 GFLOP/s at batch 32.

Either way only the packed layout is kept (a tied lm_head's weight still lives on as the embedding).
"""
import torch
from torch import nn

BATCH_HINT = 32  # oneDNN picks its blocking for this batch; measured best across batch 1..512
PANEL = 16  # output columns per panel of cpu_gemm.cpp


def packing_available(device, dtype):
    """Whether oneDNN's weight prepacking works here (CPU, fp32)."""
    if device.type != "cpu" or dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.ones(4, 4), BATCH_HINT)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 4), packed, None, "none", [], "")
        return bool(torch.all(out == 4))
    except (AttributeError, RuntimeError):  # private ops: absent or broken on some builds
        return False


class PackedLinear(nn.Module):
    """`kernels`: the compiled CPU kernels (kernels.cpu_ext.load()) for panels, or None for oneDNN."""

    def __init__(self, linear, kernels=None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        bias = None if linear.bias is None else linear.bias.detach()
        self.kernels = kernels
        if kernels is not None:
            self.packed = kernels.pack_panels(weight)  # [ceil(N / 16), K, 16]
            if bias is not None:  # padded to whole panels, as panel_linear reads them
                bias = torch.cat([bias, bias.new_zeros(self.packed.shape[0] * PANEL - self.out_features)])
        else:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)
        self.bias = bias

    def forward(self, x):
        rows = x.reshape(-1, self.in_features)
        if self.kernels is not None:
            y = self.kernels.panel_linear(rows, self.packed, self.bias, self.out_features)
        else:
            y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


def pack_linears(model, kernels=None):
    """Replace every nn.Linear of `model` by a PackedLinear (call after the weights are loaded)."""
    linears = [(module, name, child) for module in model.modules() for name, child in module.named_children()
               if isinstance(child, nn.Linear)]
    for module, name, child in linears:
        setattr(module, name, PackedLinear(child, kernels))
    return model
