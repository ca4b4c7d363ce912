"""The attention backends over the paged KV cache, by name.

Every backend module provides the same three functions (see `reference.py` for their contract):
`store_kv`, `append_prefill_attention`, `paged_decode_attention`. Both attention functions take
`window` (None: global attention; W: the query at position p sees keys (p - W, p], a sliding-window layer),
and the backends that set CHUNKED_ATTENTION `chunk` (C: keys [p // C * C, p], Llama 4's local layers).
Which backend runs a model is decided once, by engine/attention_backend.py; here a name is only looked up.
"""
import importlib
import importlib.util

from .notices import warn_once

ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton", "flash_attn")
_MODULES = {"torch": "reference", "cpu": "cpu", "triton": "triton_ops", "flash_attn": "flash"}


def backend_name(ops):
    """The attention_backend name of a module that attention_ops returned."""
    return {module: name for name, module in _MODULES.items()}[ops.__name__.rsplit(".", 1)[-1]]


def attention_ops(backend):
    """The module implementing attention backend `backend` (a name engine/attention_backend.py chose)."""
    if backend not in _MODULES:
        raise ValueError(f"unknown attention_backend {backend!r}; choose one of {', '.join(_MODULES)} "
                         "('auto' is resolved by engine.attention_backend.choose_attention_backend)")
    if backend == "triton" and not importable("triton"):
        raise RuntimeError("attention_backend='triton' needs the triton package (pip install triton)")
    if backend == "flash_attn" and not importable("flash_attn"):
        raise RuntimeError("attention_backend='flash_attn' needs flash-attn (pip install 'byzantium[flash]')")
    return importlib.import_module(f".{_MODULES[backend]}", __name__)


def importable(name):
    return importlib.util.find_spec(name) is not None


__all__ = ["ATTENTION_BACKENDS", "attention_ops", "backend_name", "importable", "warn_once"]
