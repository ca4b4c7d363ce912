"""Byzantium: multi-agent LLM protocols under faulty and adversarial agents, on a batched paged-KV engine.

Public API: Engine, AsyncEngine, SamplingParams, RequestOutput, Session; load_llm and LLMPool (the LLM
interface protocols call, on this engine or plain transformers).

The names are imported on first use (PEP 562), not with the package: `import byzantium` and commands
that need no engine (`byzantium plan`, `--help`) start without torch.
"""
import importlib

# name -> the module that defines it
_PUBLIC = {"Engine": ".engine.engine", "AsyncEngine": ".engine.async_engine", "RequestOutput": ".engine.sync_api",
           "SamplingParams": ".backends.params", "Session": ".engine.sequence", "LLMPool": ".backends",
           "load_llm": ".backends"}

__all__ = ["Engine", "AsyncEngine", "SamplingParams", "RequestOutput", "Session", "LLMPool", "load_llm"]


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'byzantium' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
