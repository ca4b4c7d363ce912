"""Which attention backend runs a model: decided once, before the KV pool is built, with the reason.

`choose_attention_backend` is the only place that decides. The runner and the kernels take its choice
as given: a backend never falls back to another one call by call, so what describe() says is what runs.

CAPABILITIES is the table it reads (docs: the same table, in prose): on which devices a backend runs,
which K/V pool dtypes it reads, whether it has the sliding-window and chunked masks our models need,
which head sizes it takes. "auto" takes the fastest backend that can run the model here: Triton on CUDA,
the compiled kernels on the CPU, the torch reference where neither can; an explicit request that
cannot run the model is refused, naming what is missing.
"""
import os
from dataclasses import dataclass

import torch

from .. import kernels
from ..kernels.reference import FP8_KV


@dataclass(frozen=True)
class Capability:
    devices: tuple  # device types; () for any
    kv_dtypes: tuple  # K/V pool dtypes it reads
    window: bool  # sliding-window layers (Gemma 3)
    chunk: bool  # chunked-attention layers (Llama 4)
    head_dims: tuple = ()  # the head sizes it takes; () for any
    needs: str = ""  # what must be installed or built


ANY_FLOAT = (torch.float32, torch.bfloat16, torch.float16)
CAPABILITIES = {
    "torch": Capability((), ANY_FLOAT + (FP8_KV,), window=True, chunk=True),
    # FP8 K/V: only on GPUs of compute capability >= 8.9 with a bf16/fp16 model (fp8_kv_on_triton)
    "triton": Capability(("cuda",), ANY_FLOAT + (FP8_KV,), window=True, chunk=True, needs="triton"),
    "flash_attn": Capability(("cuda",), (torch.bfloat16, torch.float16), window=True, chunk=False,
                             needs="flash-attn (pip install 'byzantium[flash]')"),
    # The decode and tiled prefill kernels start each query's keys at its window's or chunk's first one.
    # Prefill rows run on the tiled kernel where the CPU has AVX-512, else gather + SDPA (reference.py's).
    "cpu": Capability(("cpu",), (torch.float32, torch.bfloat16), window=True, chunk=True,
                      head_dims=(16, 32, 64, 80, 96, 128, 256), needs="the compiled CPU kernels (kernels/cpu_ext.py)"),
}
BACKENDS = tuple(CAPABILITIES)
REQUESTS = ("auto", *BACKENDS)


@dataclass(frozen=True)
class ModelFeatures:
    """What of a model the backends differ on."""
    head_dim: int | None = None
    window: bool = False  # some layer attends within a sliding window
    chunk: bool = False  # some layer attends within its chunk

    @classmethod
    def of(cls, model):
        from .layers.attention import PagedAttention
        layers = [m for m in model.modules() if isinstance(m, PagedAttention)]
        return cls(getattr(model, "head_dim", None), any(m.window is not None for m in layers),
                   any(m.chunk is not None for m in layers))


@dataclass(frozen=True)
class Choice:
    name: str  # one of BACKENDS
    reason: str  # why, for describe()


def choose_attention_backend(requested="auto", device="cpu", dtype=torch.float32, kv_cache_dtype=None,
                             cpu_kernels=True, features=ModelFeatures()):
    """The backend that runs attention for a model of `dtype` with `features` on `device`, reading a
    pool of `kv_cache_dtype` (None: `dtype`). `requested`: "auto" or a backend name, which is checked
    against CAPABILITIES (ValueError naming what it lacks). cpu_kernels=False keeps "auto" off the
    compiled CPU kernels."""
    if requested not in REQUESTS:
        raise ValueError(f"unknown attention_backend {requested!r}; choose one of {', '.join(REQUESTS)}")
    device = torch.device(device)
    kv = kv_cache_dtype or dtype
    if requested != "auto":
        missing = _missing(requested, device, dtype, kv, features) or _not_installed(requested)
        if missing:
            others = [b for b in BACKENDS if b != requested and not _missing(b, device, dtype, kv, features)]
            raise ValueError(f"attention_backend={requested!r} cannot run this model: {missing}; "
                             f"use {' or '.join(repr(b) for b in others)}")
        return Choice(requested, "requested")
    if device.type == "cuda":
        if not kernels.importable("triton"):
            kernels.warn_once("byzantium: triton is not installed, so attention on CUDA uses the torch reference "
                              "(much slower; pip install triton)")
            return Choice("torch", "auto: triton is not installed")
        missing = _missing("triton", device, dtype, kv, features)
        return Choice("torch", f"auto: {missing}") if missing else Choice("triton", "auto: CUDA with triton")
    if device.type != "cpu":
        return Choice("torch", f"auto: no compiled kernels for {device.type}")
    if not cpu_kernels:
        return Choice("torch", "auto: cpu_kernels=False")
    from ..kernels import cpu
    if not cpu.available():
        reason = f"the compiled CPU kernels are not available ({cpu.unavailable_reason('cpu')})"
        kernels.warn_once(f"byzantium: attention on cpu uses the torch reference: {reason}")
        return Choice("torch", f"auto: {reason}")
    missing = _missing("cpu", device, dtype, kv, features)
    return Choice("torch", f"auto: {missing}") if missing else Choice("cpu", "auto: the compiled CPU kernels")


def _missing(name, device, dtype, kv, features):
    """Why backend `name` cannot run this model here ("" when it can)."""
    cap = CAPABILITIES[name]
    interpreted = name == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    if cap.devices and device.type not in cap.devices and not interpreted:  # the interpreter runs CPU tensors
        return f"{name} runs on {', '.join(cap.devices)}, not {device.type}"
    if kv not in cap.kv_dtypes:
        return f"{name} does not read a {_dtype(kv)} KV cache"
    if kv == FP8_KV and name == "triton" and not fp8_kv_on_triton(device, dtype):
        return ("triton reads an FP8 KV cache only for bf16/fp16 models on CUDA GPUs of compute capability "
                ">= 8.9")
    if features.window and not cap.window:
        return f"{name} has no sliding-window attention, which this model's layers use"
    if features.chunk and not cap.chunk:
        return f"{name} has no chunked attention, which this model's layers use"
    if cap.head_dims and features.head_dim is not None and features.head_dim not in cap.head_dims:
        return f"{name} takes head sizes {', '.join(map(str, cap.head_dims))}, not {features.head_dim}"
    return ""


def _not_installed(name):
    """Why backend `name` cannot run on this machine at all ("" when it can)."""
    if name == "cpu":
        from ..kernels import cpu
        return "" if cpu.available() else f"the compiled CPU kernels are not available ({cpu.unavailable_reason()})"
    package = {"triton": "triton", "flash_attn": "flash_attn"}.get(name)
    return f"it needs {CAPABILITIES[name].needs}" if package and not kernels.importable(package) else ""


def fp8_kv_on_triton(device, dtype):
    """Triton has e4m3 conversions from compute capability 8.9, and fp32 tiles upcast from FP8 spill
    registers: bf16/fp16 models on such GPUs only."""
    return (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
            and torch.cuda.get_device_capability(device) >= (8, 9))


def _dtype(dtype):
    return str(dtype).removeprefix("torch.")
