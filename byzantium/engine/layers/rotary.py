"""Rotary position embedding: the tables (with the config's rope scaling) and their application, in torch
or on the compiled CPU kernels (fp32; bf16 where the CPU has avx512_bf16)."""
import torch


def rope_tables(config, head_dim, max_positions):
    """cos, sin [max_positions, head_dim // 2] in fp32 on the CPU, with the config's rope scaling
    (transformers' own init functions for the scaled types, so every variant matches the reference
    implementation). Computed on the CPU also while the model is built on the meta device."""
    # transformers 5 keeps rope settings in rope_parameters, 4.x in rope_scaling + rope_theta.
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "dynamic":
        raise NotImplementedError("dynamic rope scaling changes with sequence length and is not supported")
    with torch.device("cpu"):
        if rope_type == "default":
            base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
            inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
            scaling = 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
        freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
        return freqs.cos() * scaling, freqs.sin() * scaling


def rotate_tables(cos, sin):
    """Per-token cos, sin [T, 1, D/2] -> the tables apply_rope takes: cat(c, c), cat(-s, s)."""
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def rope_at(positions, inv_freq, scaling, dtype):
    """The tables apply_rope takes, [T, 1, D], computed from the positions as transformers does: no table
    of every position (Gemma 3's would be 128k long, one per kind of layer)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = (freqs.cos() * scaling).to(dtype), (freqs.sin() * scaling).to(dtype)
    return rotate_tables(cos.unsqueeze(1), sin.unsqueeze(1))


def apply_rope(x, cos, signed_sin):
    """x [T, H, D]; cos = cat(c, c), signed_sin = cat(-s, s), each [T, 1, D]: transformers' rotate-half
    x * cos + rotate_half(x) * sin, with the sign folded into the table so rotate_half is a roll."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin


def rope(x, cos, signed_sin, cpu_ops=None, bf16_ops=False):
    """apply_rope, as one compiled pass where the kernels are on and x's heads are packed rows."""
    if cpu_ops is not None and x.stride(1) == x.shape[2] and x.stride(2) == 1:
        if x.dtype == torch.float32:
            return cpu_ops.rope(x, cos, signed_sin)
        if bf16_ops and x.dtype == torch.bfloat16:
            return cpu_ops.rope_bf16(x, cos, signed_sin)
    return apply_rope(x, cos, signed_sin)
