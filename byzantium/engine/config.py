"""An engine's settings: one frozen dataclass, checked when it is made, before any model file is read, then
resolved (`resolve`: device, dtype, the defaults that depend on them) and fitted to the model (`fit_to_model`:
the context length). Each part of the engine (scheduler, runner, tensor-parallel ranks) gets it whole."""
import os
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from ..kernels import warn_once

# Prompt-lookup speculation on the CPU: draft tokens a request may take a step, and the rows a step may
# hold for drafts to be added (past ~32 rows a CPU step is compute-bound: extra rows cost, not ride free).
DEFAULT_SPECULATIVE_TOKENS = 4
DEFAULT_SPECULATIVE_ROWS = 32

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}

POSITIVE = ("block_size", "num_blocks", "max_num_seqs", "max_batch_tokens", "max_model_len", "speculative_max_rows",
            "tensor_parallel_size")
QUANTIZATIONS = ("fp8",)  # --quantization: quantize the checkpoint's weights at load
KV_CACHE_DTYPES = ("auto", "fp8")  # auto: the model's dtype


@dataclass(frozen=True)
class EngineConfig:
    """What Engine(model, **options) was asked for. None means: decided from the model and the device (by
    resolve and fit_to_model, after which device is a torch.device, dtype a torch.dtype and no field is None
    but model, num_blocks, kv_cache_gib and memory_fraction)."""
    model: object = None  # a hub id, a directory, a GGUF file; None: the embedded default model
    device: str | torch.device | None = None  # "cpu", "cuda", "cuda:1", a torch.device; None or "auto": CUDA when there is one
    dtype: str | torch.dtype | None = None  # a name from DTYPES or a torch.dtype; None or "auto": bf16 on CUDA, fp32 on the CPU
    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None  # KV blocks; None: planned from memory (memory_fraction, kv_cache_gib)
    max_num_seqs: int = 256  # sequences in one step
    max_batch_tokens: int | None = None  # tokens in one step; None: 8192 on CUDA, 2048 on the CPU (at least max_num_seqs)
    attention_backend: str = "auto"  # a backend name, or auto: decided once the model is loaded (attention_backend.py)
    max_model_len: int | None = None  # None: the model's context
    # the KV pool's size, instead of num_blocks: reserved at start (CPU: every page written then); None:
    # planned on CUDA, 2 GiB on the CPU taken as blocks are first written (memory.DEFAULT_CPU_KV_GIB)
    kv_cache_gib: float | None = None
    cpu_packed_linears: bool = True  # CPU: linears on repacked weights (layers/linear.py)
    cpu_kernels: bool = True  # CPU: Byzantium's compiled kernels (kernels/cpu_ext.py)
    profile: bool = False  # a step with prefill and decode rows runs them as two timed passes
    memory_fraction: float | None = None  # the share of the device this engine plans within
    enforce_eager: bool = False  # CUDA: no decode CUDA graphs
    num_speculative_tokens: int | None = None  # prompt-lookup drafts; None: 4 on the CPU, off on CUDA
    speculative_max_rows: int | None = None  # rows a step may hold with drafts; None: 32
    tensor_parallel_size: int = 1  # ranks the model is split over, one process each (tensor_parallel.py)
    quantization: str | None = None  # "fp8": weights quantized at load; None: as the checkpoint stores them
    kv_cache_dtype: str = "auto"  # "fp8": K/V stored as e4m3; "auto": the model's dtype

    def __post_init__(self) -> None:
        for name in POSITIVE:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        tokens = self.num_speculative_tokens
        if tokens is not None and (not isinstance(tokens, int) or tokens < 0):
            raise ValueError(f"num_speculative_tokens must be an integer >= 0, got {tokens!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {self.quantization!r}; known: {', '.join(QUANTIZATIONS)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; known: {', '.join(KV_CACHE_DTYPES)}")
        if self.memory_fraction is not None and not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction!r}")
        gib = self.kv_cache_gib
        if gib is not None and (isinstance(gib, bool) or not isinstance(gib, (int, float)) or not gib > 0):
            raise ValueError(f"kv_cache_gib must be a number of GiB > 0, got {gib!r}")


def engine_config(model: object, options: dict[str, Any]) -> EngineConfig:
    """EngineConfig(model, **options), with an unknown option named as such."""
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"Engine got unknown options {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return EngineConfig(model=model, **options)


def resolve(config: EngineConfig) -> EngineConfig:
    """The config with the device, the dtype and the defaults that follow from them decided."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    cpu = device.type == "cpu"
    if cpu and dtype == torch.bfloat16 and not cpu_has_bf16_units():
        warn_once("byzantium: this CPU has no bf16 units (avx512_bf16 or AMX), so dtype=bfloat16 runs its "
                  "linears converted in software, many times slower than float32; use dtype='float32' here")
    # Prompt-lookup speculation: on by default on the CPU, where it is checked to give the tokens plain
    # decoding gives; off on CUDA until a GPU run has checked it there.
    speculative = config.num_speculative_tokens
    return replace(config, device=device, dtype=dtype,
                   max_batch_tokens=config.max_batch_tokens or max(2048 if cpu else 8192, config.max_num_seqs),
                   num_speculative_tokens=(DEFAULT_SPECULATIVE_TOKENS if cpu else 0) if speculative is None else speculative,
                   speculative_max_rows=config.speculative_max_rows or DEFAULT_SPECULATIVE_ROWS)


def fit_to_model(config: EngineConfig, model: torch.nn.Module) -> EngineConfig:
    """The config with max_model_len within what the model attends to: its positions, or its sliding window
    when its attention does not implement one."""
    context = model.max_positions
    text = model.config
    window = getattr(text, "sliding_window", None)
    if window and getattr(text, "use_sliding_window", True) and not getattr(model, "implements_sliding_window", False):
        context = min(context, window)
    return replace(config, max_model_len=min(config.max_model_len or context, context))


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        # BYZANTIUM_DEVICE, read when an engine is made: the device an engine gets when none is named (the
        # test suite sets "cpu", so tests that assert CPU fp32 results keep them on a GPU machine)
        device = os.environ.get("BYZANTIUM_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA device")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def cpu_has_bf16_units() -> bool:
    """Whether this CPU multiplies bf16 in hardware (avx512_bf16 or AMX), where oneDNN and our bf16 panels run."""
    probes = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return any(probe() for probe in probes if probe is not None)
