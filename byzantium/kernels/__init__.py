"""The one dispatch point for attention over the paged KV cache.

Every backend module provides the same three functions (see `reference.py` for their contract):
`store_kv`, `append_prefill_attention`, `paged_decode_attention`. Both attention functions take
`window` (None: global attention; W: the query at position p sees keys (p - W, p], a sliding-window layer).
"""
import importlib
import importlib.util

from .notices import warn_once

ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton", "flash_attn")


def backend_name(ops):
    """The attention_backend name of a module that attention_ops returned."""
    return {"reference": "torch", "cpu": "cpu", "triton_ops": "triton", "flash": "flash_attn"}[ops.__name__.rsplit(".", 1)[-1]]


def attention_ops(backend="auto", device="cpu"):
    """Return the module implementing attention for `backend` on `device`.

    auto: Triton on CUDA when triton imports; on the CPU the compiled kernels (cpu.py) when they
    build, the torch reference otherwise.
    """
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention_backend {backend!r}; choose one of {', '.join(ATTENTION_BACKENDS)}")
    device_type = getattr(device, "type", str(device).split(":")[0])
    if backend == "auto":
        if device_type == "cuda":
            backend = "triton" if _importable("triton") else "torch"
            if backend == "torch":
                warn_once("byzantium: triton is not installed, so attention on CUDA uses the torch reference "
                          "(much slower; pip install triton)")
        else:
            from . import cpu
            backend = "cpu" if device_type == "cpu" and cpu.available() else "torch"
            if backend == "torch":
                warn_once(f"byzantium: attention on {device_type} uses the torch reference: the compiled CPU "
                          f"kernels are not available ({cpu.unavailable_reason(device_type)})")
    if backend == "torch":
        from . import reference
        return reference
    if backend == "cpu":
        from . import cpu
        return cpu
    if backend == "triton":
        if not _importable("triton"):
            raise RuntimeError("attention_backend='triton' needs the triton package (pip install triton)")
        return importlib.import_module(".triton_ops", __name__)
    if not _importable("flash_attn"):
        raise RuntimeError("attention_backend='flash_attn' needs flash-attn (pip install 'byzantium[flash]')")
    return importlib.import_module(".flash", __name__)


def _importable(name):
    return importlib.util.find_spec(name) is not None
