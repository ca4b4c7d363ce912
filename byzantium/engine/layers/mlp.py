"""The gated MLP: down(act(gate) * up), gate and up as one fused linear. SiLU (the Llama family) may run
on the compiled CPU kernels, and fused with the gate_up linear itself where that runs on the panels
(PackedLinear.repack_glu); GELU-tanh (Gemma 3) is torch's.

Under tensor parallelism gate_up is column-parallel and down row-parallel (layers/parallel.py): each rank
holds a share of the intermediate channels, and the partial outputs are summed over ranks."""
import torch
import torch.nn.functional as F
from torch import nn

from . import parallel

ACTIVATIONS = ("silu", "gelu_tanh")


class GatedMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, bias=False, activation="silu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; one of {', '.join(ACTIVATIONS)}")
        self.activation = activation
        self.tp = parallel.current()  # the group its sums run over
        intermediate_size = parallel.split(intermediate_size, "the MLP's intermediate size")
        self.gate_up_proj = parallel.column(nn.Linear(hidden_size, 2 * intermediate_size, bias=bias))
        self.down_proj = parallel.row(nn.Linear(intermediate_size, hidden_size, bias=bias))
        self.cpu_ops = None  # the compiled CPU kernels (SiLU only)
        self.glu = None  # (kernel, panels, bias, I) when a panel_glu kernel fuses gate_up and SiLU * up

    def use_cpu_ops(self, kernels):
        if self.activation != "silu":
            return
        self.cpu_ops = kernels
        repack = getattr(self.gate_up_proj, "repack_glu", None)  # a PackedLinear (on panels: it can fuse)
        self.glu = repack(kernels) if kernels is not None and repack is not None else None

    def forward(self, x):
        return parallel.all_reduce(self._forward(x), self.tp)

    def _forward(self, x):
        if self.glu is not None and x.dtype == self.glu[1].dtype and x.dim() == 2:
            return self.down_proj(self.glu[0](x, *self.glu[1:]))
        gate_up = self.gate_up_proj(x)
        if self.cpu_ops is not None and gate_up.dtype == torch.float32 and gate_up.dim() == 2:
            return self.down_proj(self.cpu_ops.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        if self.activation == "gelu_tanh":
            return self.down_proj(F.gelu(gate, approximate="tanh") * up)
        return self.down_proj(F.silu(gate) * up)
