"""RMSNorm in its two forms: the Llama family's (normalise in fp32, cast, then scale by w; on the compiled
CPU kernels when the engine turns them on) and Gemma's (scale by 1 + w in fp32, then cast)."""
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.cpu_ops = None  # the compiled CPU kernels, when the engine runs them (use_cpu_ops)
        self.bf16_ops = False  # and their bf16 variants (CPUs with avx512_bf16)

    def forward(self, x):
        if self.cpu_ops is not None and x.dtype == torch.float32:
            return self.cpu_ops.rms_norm(x.reshape(-1, x.shape[-1]), self.weight, self.eps).view(x.shape)
        if self.bf16_ops and x.dtype == torch.bfloat16:
            return self.cpu_ops.rms_norm_bf16(x.reshape(-1, x.shape[-1]), self.weight, self.eps).view(x.shape)
        # transformers' formula op for op (normalise in fp32, scale in the input dtype); on CPU it is
        # also faster than F.rms_norm for the small rows of decode steps.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def add_forward(self, x, residual):
        """(norm(x + residual), x + residual): the residual stream's add done in the norm's own pass
        (residual None, the first layer: x alone)."""
        if residual is None:
            return self(x), x
        if self.cpu_ops is not None and x.dtype == torch.float32:
            return self.cpu_ops.add_rms_norm(x, residual, self.weight, self.eps)
        if self.bf16_ops and x.dtype == torch.bfloat16 and x.dim() == 2:
            return self.cpu_ops.add_rms_norm_bf16(x, residual, self.weight, self.eps)
        residual = x + residual
        return self(residual), residual


class GemmaRMSNorm(nn.Module):
    """Gemma's: normalise and scale by (1 + w) in fp32, then cast (Llama casts before scaling)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)
