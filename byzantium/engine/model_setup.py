"""An engine's model: built on meta, its weights read straight to the device at the target dtype (FP8
where quantization.py says so), then set on the CPU kernels measured fastest here (linears) and the
compiled layer ops (norms, rope, SiLU)."""
from dataclasses import dataclass

import torch

from ..kernels import cpu_ext, warn_once
from .layers.linear import pack_linears, packing_available
from .loader import iter_safetensors
from .quantization import checkpoint_tensors, quantization_spec, swap_fp8_experts, swap_fp8_linears


@dataclass
class ModelSetup:
    model: torch.nn.Module
    linear_kernels: object  # "torch", or {"INxOUT": kernel name} as measured on this CPU
    linear_timings: dict  # {shape: {candidate: seconds}} measured by this start (empty when cached)
    cpu_layer_ops: bool  # norms, rope and SiLU * up on the compiled kernels
    quantization: object = None  # quantization.Fp8Spec of the FP8 linears and experts, None when there are none


def load_model(model_class, config, model_dir, dtype, device, options):
    """The model of checkpoint `config` in `model_dir`, as EngineConfig `options` ask (every tensor-parallel
    rank builds its own slice with this, the current layers.parallel group deciding which)."""
    cpu_packed_linears, cpu_kernels = options.cpu_packed_linears, options.cpu_kernels
    spec = quantization_spec(config, getattr(options, "quantization", None))  # an unknown format fails here, before any weight is read
    with torch.device("meta"):  # no random init of weights we overwrite anyway
        model = model_class(config)
    # Cast on meta first, so every weight is allocated once, at the target dtype (casting after
    # to_empty would hold an fp32 copy: twice the bf16 weights at the peak).
    model = model.to(dtype)
    fp8_parts = set()  # after .to(dtype), which would cast them: FP8 linears and MoE experts, on meta
    if spec is not None:
        fp8_parts = swap_fp8_linears(model, spec) | swap_fp8_experts(model, spec)
    model = model.to_empty(device=device)
    model.init_buffers(device)  # what to_empty left uninitialised: rope tables, tied weights
    tensors = iter_safetensors(model_dir, device)  # one tensor at a time, straight to the device
    if spec is not None:  # FP8 weights paired with their scales (or dequantized), static scales dropped
        tensors = checkpoint_tensors(tensors, spec, fp8_parts, dtype)
    model.load_weights(tensors)
    linear_kernels, linear_timings = "torch", {}
    cpu = device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
    if cpu_packed_linears and cpu:
        kernels = cpu_ext.load() if cpu_kernels else None  # load() logs why it is None; bf16: its panels
        onednn = packing_available(device, dtype)
        if dtype == torch.float32 and kernels is None and not onednn:
            warn_once("byzantium: oneDNN weight packing does not work in this torch build; "
                      "the linears are plain torch (slower on the CPU)")
        linear_kernels, linear_timings = pack_linears(model, kernels, onednn, dtype)
    # The norms, rotary embedding and SiLU * up as single compiled passes (fp32 on the CPU; bf16 norms and
    # rope with avx512_bf16); gate_up fused with SiLU * up where it runs on the panels (fp32 AVX2 or AVX-512, bf16).
    compiled = cpu_kernels and cpu and hasattr(model, "use_cpu_ops") and cpu_ext.load() is not None
    if compiled:
        model.use_cpu_ops(cpu_ext.load())
    layer_ops = compiled and (dtype == torch.float32 or cpu_ext.load().avx512_bf16_supported())
    return ModelSetup(model.eval(), linear_kernels, linear_timings, layer_ops, spec if fp8_parts else None)
