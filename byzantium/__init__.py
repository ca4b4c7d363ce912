"""Byzantium: multi-agent LLM protocols under faulty and adversarial agents, on a batched paged-KV engine.

Public API: Engine, AsyncEngine, SamplingParams, RequestOutput, Session; load_llm and LLMPool (the LLM
interface protocols call, on this engine or plain transformers).

The names are imported on first use (PEP 562), not with the package: `import byzantium` and commands
that need no engine (`byzantium plan`, `--help`) start without torch.
"""
from typing import TYPE_CHECKING

from .lazy_exports import lazy_exports

if TYPE_CHECKING:  # what editors and type checkers see; at run time the names load on first use
    from .backends import LLMPool, load_llm
    from .engine.async_engine import AsyncEngine
    from .engine.engine import Engine
    from .engine.sampling import SamplingParams
    from .engine.sequence import Session
    from .engine.sync_api import RequestOutput

# name -> the module that defines it
_PUBLIC = {"Engine": ".engine.engine", "AsyncEngine": ".engine.async_engine", "RequestOutput": ".engine.sync_api",
           "SamplingParams": ".engine.sampling", "Session": ".engine.sequence", "LLMPool": ".backends",
           "load_llm": ".backends"}

__all__ = ["Engine", "AsyncEngine", "SamplingParams", "RequestOutput", "Session", "LLMPool", "load_llm"]


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
