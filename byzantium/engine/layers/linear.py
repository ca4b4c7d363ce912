"""CPU linears (fp32, bf16) with their weights repacked once at load time, each shape on the kernel that
measured fastest on this machine (kernels/linear_choice.py).

The candidates: Byzantium's panel GEMM (kernels/cpu_gemm.cpp, fp32, when the CPU kernels build; its
AVX-512 instantiation where the CPU has AVX-512), oneDNN's prepacked weights (the path
torch.compile's CPU freezing takes; bf16 on CPUs with bf16 units) and plain F.linear (transformers' path,
where it is batch-invariant). Decode and prefill rows run on the same kernel, so a token's K/V do not
depend on the pass that computed it. Only the packed layouts are kept (a tied lm_head's weight still
lives on as the embedding).
"""
import torch
from torch import nn

from ...kernels.linear_choice import Panels, candidates, choose


def packing_available(device, dtype):
    """Whether oneDNN's weight prepacking works here (CPU; fp32, or bf16 where the CPU has bf16 units)."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    try:
        if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.ones(4, 4, dtype=dtype), 32)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 4, dtype=dtype), packed, None, "none", [], "")
        return bool(torch.all(out == 4))
    except (AttributeError, RuntimeError):  # private ops: absent or broken on some builds
        return False


class PackedLinear(nn.Module):
    """A linear whose weight is packed for its kernel (a linear_choice.Candidate)."""

    def __init__(self, linear, kernel):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        bias = None if linear.bias is None else linear.bias.detach()
        self.kernel = kernel
        self.packed = kernel.pack(weight)
        self.packed_bias = kernel.pad_bias(bias, self.packed, self.out_features) if bias is not None and isinstance(
            kernel, Panels) else bias
        self.glu = 0  # packed by pack_glu / pack_glu512 / pack_glu_bf16 (repack_glu): gate (and up) columns a panel

    def forward(self, x):
        rows = x.reshape(-1, self.in_features)
        if self.glu:  # the panels' columns are interleaved (glu gate, glu up): put them back in order
            panels, width = self.packed.shape[0], self.glu
            y = self.kernel.run(rows, self.packed, self.packed_bias, panels * 2 * width)
            half = self.out_features // 2
            y = y.view(-1, panels, 2, width).transpose(1, 2).reshape(-1, 2, panels * width)[:, :, :half]
            y = y.reshape(-1, 2 * half)
        else:
            y = self.kernel.run(rows, self.packed, self.packed_bias, self.out_features)
        return y.view(*x.shape[:-1], self.out_features)

    def repack_glu(self, kernels):
        """Repack a fused gate_up weight [2I, K] held on the panels (fp32: `kernels.panel_glu`, AVX-512:
        `kernels.panel_glu512`) or the bf16 panels (`kernels.panel_glu_bf16`), whose blocks compute
        silu(gate) * up as they go. Returns (glu kernel, panels, bias or None, I), or None where it does not
        apply (another kernel)."""
        name = self.kernel.name
        if name == "panels":
            pack, glu, width = kernels.pack_glu, kernels.panel_glu, 8
        elif name == "panels512" and kernels.avx512_supported():
            pack, glu, width = kernels.pack_glu512, kernels.panel_glu512, 16
        elif name == "panels_bf16" and kernels.avx512_bf16_supported():
            pack, glu, width = kernels.pack_glu_bf16, kernels.panel_glu_bf16, 16
        else:
            return None
        if not self.glu:
            packed, bias, half = self.packed, self.packed_bias, self.out_features // 2
            if packed.dim() == 3:  # fp32 panels [P, K, 16 or 32]
                weight = packed.transpose(1, 2).reshape(-1, self.in_features)[:self.out_features]
            else:  # bf16 panels [P, K/2, 32, 2]
                weight = packed.permute(0, 2, 1, 3).reshape(packed.shape[0] * 32, -1)[:self.out_features, :self.in_features]
            packed = pack(weight.contiguous())
            if bias is not None:
                panels = packed.shape[0]
                gate, up = (torch.cat([b, b.new_zeros(panels * width - half)]).view(panels, width)
                            for b in (bias[:half], bias[half:2 * half]))
                bias = torch.cat([gate, up], dim=1).flatten()
            self.packed, self.packed_bias, self.glu = packed, bias, width
        return glu, self.packed, self.packed_bias, self.out_features // 2

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, kernel={self.kernel.name}"


def pack_linears(model, kernels=None, onednn=True, dtype=torch.float32):
    """Replace every nn.Linear of `model` by a PackedLinear on the kernels chosen for its shape (call after
    the weights are loaded). Returns ({"INxOUT": kernel name}, {shape: measured seconds})."""
    available = candidates(kernels, onednn, dtype)
    linears = [(module, name, child) for module in model.modules() for name, child in module.named_children()
               if isinstance(child, nn.Linear)]
    by_shape = {}
    for _, _, child in linears:
        by_shape.setdefault((child.in_features, child.out_features), []).append(child.weight.detach())
    choices, measured = choose(by_shape, available)
    if not choices:
        return {}, {}
    named = {c.name: c for c in available}
    for module, name, child in linears:
        setattr(module, name, PackedLinear(child, named[choices[(child.in_features, child.out_features)]]))
    return {f"{k}x{n}": choice for (k, n), choice in choices.items()}, measured
