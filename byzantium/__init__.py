"""Byzantium: multi-agent LLM protocols under faulty and adversarial agents, on a batched paged-KV engine.

Public API: Engine, AsyncEngine, SamplingParams, RequestOutput, Session; load_llm and LLMPool (the LLM
interface protocols call, on this engine or plain transformers).
"""
from .engine.async_engine import AsyncEngine
from .engine.engine import Engine
from .engine.sync_api import RequestOutput
from .backends.params import SamplingParams
from .engine.sequence import Session
from .backends import LLMPool, load_llm

__all__ = ["Engine", "AsyncEngine", "SamplingParams", "RequestOutput", "Session", "LLMPool", "load_llm"]
