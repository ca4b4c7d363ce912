"""What protocols call: the LLM interface (base.LLM) and its implementations.

    pool = LLMPool(backend="native", device="cpu")   # engine kwargs for every model it loads
    strong, weak = pool.get("smollm2-135m"), pool.get("some/other-model")
    ...
    pool.close()

Each distinct model is loaded once per pool and shared by every agent that names it.
"""
from ..engine.loader import DEFAULT_MODEL, resolve_model
from .base import LLM, Completion
from .params import SamplingParams

BACKENDS = ("native", "hf")


def _check_backend(backend):
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def _build(backend, model_dir, name, kwargs):
    if backend == "native":
        from .native import NativeLLM
        return NativeLLM(model_dir, name, **kwargs)
    from .hf import HFLLM
    return HFLLM(model_dir, name, **kwargs)


def load_llm(model=None, backend="native", **kwargs) -> LLM:
    """One model on one backend. kwargs: AsyncEngine's (native) or device/dtype/max_model_len (hf)."""
    _check_backend(backend)
    model_dir = resolve_model(model)  # an unknown name fails here, before anything heavy loads
    return _build(backend, model_dir, str(model or DEFAULT_MODEL), kwargs)


def check_model(name):
    """Fail on an unknown model without loading it. Local names and paths resolve for certain; a hub
    id not in the local cache is looked up on the hub, and accepted when the hub cannot be reached."""
    from pathlib import Path
    from ..engine.loader import _HUB_ID
    if name is None or Path(name).expanduser().exists() or not _HUB_ID.match(name):
        resolve_model(name)
        return
    try:
        from huggingface_hub import HfApi, try_to_load_from_cache
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
        HfApi().model_info(name, timeout=10)
    except ImportError:
        return
    except Exception as error:
        if type(error).__name__ in ("RepositoryNotFoundError", "GatedRepoError", "HFValidationError"):
            raise ValueError(f"unknown model {name!r}: not on the Hugging Face hub ({type(error).__name__})")
        # offline or hub trouble: the loader reports it when the model is loaded


class LLMPool:
    """Loads each distinct model once (names resolving to the same directory share it)."""

    def __init__(self, backend="native", **kwargs):
        _check_backend(backend)
        self.backend, self.kwargs = backend, kwargs
        self._llms = {}  # resolved model directory -> LLM

    def check(self, model=None):
        """Fail on an unknown model name without loading anything; returns its directory."""
        return resolve_model(model)

    def get(self, model=None) -> LLM:
        model_dir = resolve_model(model)
        if model_dir not in self._llms:
            self._llms[model_dir] = _build(self.backend, model_dir, str(model or DEFAULT_MODEL), self.kwargs)
        return self._llms[model_dir]

    @property
    def llms(self):
        return list(self._llms.values())

    def close(self):
        for llm in self._llms.values():
            llm.close()
        self._llms.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["BACKENDS", "LLM", "Completion", "LLMPool", "SamplingParams", "check_model", "load_llm"]
