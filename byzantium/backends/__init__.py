"""What protocols call: the LLM interface (base.LLM) and its implementations.

    pool = LLMPool(backend="native", device="cpu")   # engine kwargs for every model it loads
    strong, weak = pool.get("smollm2-135m"), pool.get("some/other-model")
    ...
    pool.close()

    pool = LLMPool("openai", base_url="http://127.0.0.1:8000")   # models a server serves, by its names
    with LLMPool("native", ray="HOST:6379", ray_replicas=4) as pool:   # replicas as Ray actors (ray_engines)
        ...

Each distinct model is loaded once per pool and shared by every agent that names it. A Ray pool's
placement (which instance runs on which replica) is in scope for the runs started inside its `with`
block: the experiment runner finds it there (current_placement), so experiments need not pass it.
"""
from __future__ import annotations

import contextvars
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..engine.loader import DEFAULT_MODEL, resolve_model
from .base import LLM, Completion
from ..engine.sampling import SamplingParams

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    import torch

    from .ray_placement import Placement

BACKENDS = ("native", "hf", "openai")
LOCAL_BACKENDS = ("native", "hf")  # the ones that load the model here (openai: a server has it)
PLACEMENT: contextvars.ContextVar[Placement | None] = contextvars.ContextVar("byzantium_placement", default=None)


def current_placement() -> Placement | None:
    """The placement of the Ray pool whose `with` block we are in (None: one process, no replicas)."""
    return PLACEMENT.get()


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def _build(backend: str, model_dir: str | Path, name: str | None, kwargs: dict[str, Any]) -> LLM:
    if backend == "openai":  # model_dir: the name the server serves
        from .openai import OpenAILLM
        return OpenAILLM(model_dir, **kwargs)
    if backend == "native":
        from .native import NativeLLM
        return NativeLLM(model_dir, name, **kwargs)
    from .hf import HFLLM
    return HFLLM(model_dir, name, **kwargs)


def load_llm(model: str | os.PathLike[str] | None = None, backend: str = "native", **kwargs: Any) -> LLM:
    """One model on one backend. kwargs: AsyncEngine's (native), device/dtype/max_model_len (hf), or
    OpenAILLM's (openai: base_url, api_key, tokenizer, ...; the model is any name the server serves)."""
    _check_backend(backend)
    if backend == "openai":
        return _build(backend, str(model or DEFAULT_MODEL), None, kwargs)
    model_dir = resolve_model(model)  # an unknown name fails here, before anything heavy loads
    return _build(backend, model_dir, str(model or DEFAULT_MODEL), kwargs)


def check_openai_models(base_url: str, api_key: str | None = None, names: Iterable[str | None] = (None,)) -> None:
    """Fail (ValueError) unless the server at base_url answers GET /v1/models and serves every name
    (None: the default model). Called before a run starts."""
    import openai
    from .openai_wire import api_base
    client = openai.OpenAI(base_url=api_base(base_url), api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                           max_retries=1, timeout=30)
    try:
        served = [m.id for m in client.models.list()]
    except openai.APIConnectionError as error:
        raise ValueError(f"cannot reach the OpenAI-compatible server at {base_url} ({error})") from None
    except openai.APIStatusError as error:
        raise ValueError(f"the server at {base_url} answered {error.status_code} to GET /v1/models: "
                         f"{error.message}") from None
    finally:
        client.close()
    for name in dict.fromkeys(str(n or DEFAULT_MODEL) for n in names):
        if name not in served:
            raise ValueError(f"model {name!r} is not served at {base_url}; it serves: {', '.join(served) or 'nothing'}")


def check_model(name: str | None) -> None:
    """Fail on an unknown model without loading it. Local names and paths resolve for certain; a hub
    id not in the local cache is looked up on the hub, and accepted when the hub cannot be reached."""
    from pathlib import Path
    from ..engine.loader import HUB_ID
    if name is None or Path(name).expanduser().exists() or not HUB_ID.match(name):
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


MEMORY_OPTIONS = ("num_blocks", "kv_cache_gib", "memory_fraction")  # an engine given one plans its own memory


def check_model_options(backend: str, model_options: dict[str, dict[str, Any]] | None
                        ) -> dict[str, dict[str, Any]]:
    """{name: {engine option: value}} checked before anything loads: native engines' options only, each an
    EngineConfig field (not `model`) with a value EngineConfig accepts; a ValueError naming the model."""
    if not model_options:
        return {}
    if backend != "native":
        raise ValueError(f"model_options are engine options (backend native), not for backend {backend}")
    if not isinstance(model_options, dict):
        raise ValueError(f"model_options must be {{model name: {{option: value}}}}, got {model_options!r}")
    from dataclasses import fields

    from ..engine.config import EngineConfig
    known = {f.name for f in fields(EngineConfig)} - {"model"}
    checked = {}
    for name, options in model_options.items():
        if not isinstance(options, dict):
            raise ValueError(f"model_options[{name!r}] must be a dict of engine options, got {options!r}")
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"model_options[{name!r}]: unknown engine option{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            EngineConfig(**options)
        except (TypeError, ValueError) as error:
            raise ValueError(f"model_options[{name!r}]: {error}") from None
        checked[str(name)] = dict(options)
    return checked


class LLMPool:
    """Loads each distinct model once (names resolving to the same directory share it).

    Several native models on one GPU: `plan(models)` before loading them splits the device between them
    (`memory_fraction` of it in all, default 0.9: each model's weights, then KV for the same number of
    tokens each; or `shares`, {model: fraction of the device}); each engine then plans its KV cache in
    its share (Engine(memory_fraction=...)).

    model_options: {model name: engine options} for that model only (tensor_parallel_size, quantization,
    kv_cache_dtype, dtype, ...), over the pool's kwargs; a name matches the name given to get/plan, or
    one resolving to the same directory."""

    def __init__(self, backend: str = "native", memory_fraction: float | None = None, ray: bool | str | None = None,
                 ray_replicas: int | None = None, ray_gpus_per_replica: float | None = None,
                 model_options: dict[str, dict[str, Any]] | None = None, **kwargs: Any) -> None:
        """ray: None (this process), True (a local Ray instance) or a cluster's address: each model then
        runs as `ray_replicas` engines (Ray actors, `ray_gpus_per_replica` GPUs each; see ray_engines)."""
        _check_backend(backend)
        if memory_fraction is not None and not 0 < memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
        self.model_options = check_model_options(backend, model_options)
        self.backend, self.kwargs, self.memory_fraction = backend, kwargs, memory_fraction
        self._llms: dict[str | Path, LLM] = {}  # resolved model directory -> LLM
        self._option_dirs: dict[str, Path | None] = {}  # model_options name -> its directory here (None: not here)
        self.shares: dict[str | Path, float] = {}  # resolved model directory -> its engine's memory_fraction (after plan)
        self.placement: Placement | None = None
        self._scope: contextvars.Token[Placement | None] | None = None
        if ray is not None and ray is not False:
            _check_ray(backend, ray_replicas, ray_gpus_per_replica)
            if kwargs.get("profile") or any(o.get("profile") for o in self.model_options.values()):
                raise ValueError("`byzantium profile` profiles engines in this process; run it without --ray")
            from .ray_placement import Placement
            self.placement = Placement(None if ray is True else str(ray), ray_replicas, ray_gpus_per_replica)

    def options(self, model: str | None = None, model_dir: str | Path | None = None) -> dict[str, Any]:
        """The engine kwargs of one model: the pool's, updated with its model_options (by the name given,
        else by a name resolving to the same directory)."""
        own = self.model_options.get(str(model or DEFAULT_MODEL))
        if own is None and self.model_options:
            model_dir = model_dir or self._key(model)
            found = {key: options for key, options in self.model_options.items() if self._option_dir(key) == model_dir}
            if len({repr(sorted(o.items())) for o in found.values()}) > 1:
                raise ValueError(f"model_options names {model!r} as {', '.join(found)}, with different options")
            own = next(iter(found.values()), None)
        return {**self.kwargs, **(own or {})}

    def _option_dir(self, name: str) -> Path | None:
        """The directory a model_options name resolves to when it is on this machine (nothing downloaded:
        a hub id only from the local cache); None otherwise."""
        if name not in self._option_dirs:
            from pathlib import Path

            from ..engine.loader import EMBEDDED, HUB_ID
            found = None
            try:
                if name.lower() in EMBEDDED or Path(name).expanduser().exists():
                    found = resolve_model(name)
                elif HUB_ID.match(name):
                    from huggingface_hub import try_to_load_from_cache
                    config = try_to_load_from_cache(name, "config.json")
                    found = Path(config).parent if isinstance(config, str) else None
            except Exception:  # not a model here: it matches nothing
                found = None
            self._option_dirs[name] = found
        return self._option_dirs[name]

    def plan(self, models: Iterable[str | None], shares: dict[str, float] | None = None) -> dict[str | Path, float]:
        """Split the device between the native models this pool will hold (before any of them loads).
        On CPU only with a memory_fraction or shares (the KV pool's pages cost nothing until written).
        On Ray each replica has its own GPU share (ray_gpus_per_replica); the models' count sizes the pool.

        Each model is sized as one rank of it holds (memory.model_memory: its tensor_parallel_size and
        quantization, an FP8 checkpoint's linears as stored, K/V heads per rank max(1, kv_heads // tp),
        kv_cache_dtype), and the pool's device is split between those ranks. With the default device every
        tensor-parallel group's rank 0 is on GPU 0 (rank r on GPU r), so this is GPU 0's plan; ranks on
        other GPUs plan the same share of theirs. A model whose own options fix its memory (num_blocks,
        kv_cache_gib, memory_fraction) is left out of the split (its memory_fraction taken off the pool's)."""
        if self.placement is not None:
            self.placement.plan(models)
            return self.shares
        if self.backend != "native" or any(k in self.kwargs for k in MEMORY_OPTIONS):
            return self.shares
        from ..engine.config import resolve_device, resolve_dtype
        from ..engine.memory import DEFAULT_MEMORY_FRACTION, model_memory, physical_memory, split_memory
        device = resolve_device(self.kwargs.get("device"))
        if shares is not None:
            self.shares = {resolve_model(m): float(f) for m, f in shares.items()}
            if not all(0 < f <= 1 for f in self.shares.values()) or sum(self.shares.values()) > 1:
                raise ValueError(f"memory shares must each be in (0, 1] and sum to at most 1, got {shares}")
            return self.shares
        if device.type != "cuda" and self.memory_fraction is None:
            return self.shares
        fraction = self.memory_fraction or DEFAULT_MEMORY_FRACTION
        sizes, seen = {}, set()
        for model in models:
            model_dir = resolve_model(model)
            if model_dir in seen:
                continue
            seen.add(model_dir)
            options = self.options(model, model_dir)
            if any(k in options for k in MEMORY_OPTIONS):  # it plans itself
                fraction -= options.get("memory_fraction", 0)
                continue
            itemsize = resolve_dtype(options.get("dtype"), device).itemsize
            sizes[model_dir] = model_memory(model_dir, itemsize, options.get("tensor_parallel_size", 1),
                                            options.get("quantization"), options.get("kv_cache_dtype", "auto"))
        if not sizes:
            return self.shares
        if fraction <= 0:
            raise ValueError("the models' own memory_fraction options leave nothing of the pool's for the others")
        total = self._device_memory(device) if device.type == "cuda" else physical_memory()
        self.shares = split_memory(sizes, fraction, total)
        return self.shares

    @staticmethod
    def _device_memory(device: torch.device) -> int:
        import torch
        return torch.cuda.get_device_properties(device).total_memory

    def check(self, model: str | None = None) -> str | Path:
        """Fail on an unknown model name without loading anything; returns its directory (openai: the
        name, which the server checks)."""
        return self._key(model)

    def _key(self, model: str | None) -> str | Path:
        return str(model or DEFAULT_MODEL) if self.backend == "openai" else resolve_model(model)

    def get(self, model: str | None = None) -> LLM:
        model_dir = self._key(model)
        if model_dir not in self._llms:
            kwargs = self.options(model, model_dir)
            if self.backend == "native" and not any(k in kwargs for k in MEMORY_OPTIONS):  # else: its own
                if self.shares:
                    if model_dir not in self.shares:
                        raise ValueError(f"model {model!r} is not in this pool's memory plan ({len(self.shares)} "
                                         f"models); plan every model before loading")
                    kwargs = {**kwargs, "memory_fraction": self.shares[model_dir]}
                elif self.memory_fraction is not None:
                    kwargs = {**kwargs, "memory_fraction": self.memory_fraction}
            if self.placement is not None:
                self._llms[model_dir] = self.placement.add(str(model or DEFAULT_MODEL), str(model or DEFAULT_MODEL),
                                                           kwargs)
            else:
                self._llms[model_dir] = _build(self.backend, model_dir, str(model or DEFAULT_MODEL), kwargs)
        return self._llms[model_dir]

    @property
    def llms(self) -> list[LLM]:
        return list(self._llms.values())

    def close(self) -> None:
        for llm in self._llms.values():
            llm.close()
        self._llms.clear()
        if self.placement is not None:
            self.placement.close()  # stops Ray when this pool started it

    def __enter__(self) -> LLMPool:
        if self.placement is not None:
            self._scope = PLACEMENT.set(self.placement)  # runs started inside find it (current_placement)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._scope is not None:
            PLACEMENT.reset(self._scope)
            self._scope = None
        self.close()


def _check_ray(backend: str, replicas: int | None, gpus_per_replica: float | None) -> None:
    import importlib.util
    if backend != "native":
        raise ValueError(f"--ray runs this engine's replicas as Ray actors (--backend native), not --backend {backend}")
    if importlib.util.find_spec("ray") is None:
        raise ValueError("--ray needs Ray: pip install 'byzantium[ray]'")
    if replicas is not None and replicas < 1:
        raise ValueError(f"--ray-replicas must be >= 1, got {replicas}")
    if gpus_per_replica is not None and not 0 <= gpus_per_replica <= 1:
        raise ValueError(f"--ray-gpus-per-replica must be in [0, 1] (an engine runs on one GPU), got {gpus_per_replica}")


# -- a run's flags (the CLI's `run` methods, `run resilience`) ---------------------------------------------

def add_backend_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--backend", choices=BACKENDS, default="native",
                    help="native (this engine; default), hf (plain transformers) or openai (an OpenAI-compatible "
                         "server at --base-url; --device and --dtype are then ignored)")
    ap.add_argument("--base-url", default=None, metavar="URL",
                    help="--backend openai: the server, e.g. http://127.0.0.1:8000 (a URL without a path: its /v1)")
    ap.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="NAME",
                    help="--backend openai: the environment variable holding the API key (default OPENAI_API_KEY)")
    ap.add_argument("--memory-fraction", type=float, default=None, metavar="F",
                    help="native: the share of the device the run's engines use in all, weights, activations and KV "
                         "(vLLM's --gpu-memory-utilization; default 0.9 of a GPU; on CPU the KV pool is sized from "
                         "the run and capped by a share of RAM)")
    ap.add_argument("--enforce-eager", action="store_true",
                    help="native on CUDA: decode without CUDA graphs (CPU engines are always eager)")
    ap.add_argument("--num-speculative-tokens", type=int, default=None, metavar="K",
                    help="native: prompt-lookup draft tokens a request may take a step (the tokens stay those of "
                         "plain decoding; default 4 on CPU, 0 = off, which is the default on CUDA)")
    add_model_split_args(ap)
    ap.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                    help="run each model as replicas on Ray (pip install 'byzantium[ray]'): at ADDRESS (a cluster, "
                         "e.g. HOST:6379), or without one on a local Ray instance. Each problem runs on one replica; "
                         "--concurrency then counts problems in flight per replica")
    ap.add_argument("--ray-replicas", type=int, default=None, metavar="N",
                    help="--ray: replicas per model (default: as many as the cluster's GPUs fit; on CPU 1)")
    ap.add_argument("--ray-gpus-per-replica", type=float, default=None, metavar="F",
                    help="--ray: GPUs per replica, a fraction to share a GPU between small models "
                         "(default 1 on a cluster with GPUs, else 0)")


def add_model_split_args(ap: argparse.ArgumentParser) -> None:
    """How a native engine holds a model too big for one device: the flags `run`, `sweep` and `serve` share."""
    ap.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                    help="native: split each model over N devices (one process per rank; NCCL on CUDA, gloo on "
                         "the CPU); with --ray a replica is one such group on one node (default 1)")
    ap.add_argument("--quantization", choices=("fp8",), default=None,
                    help="native: fp8 quantizes the weights at load (e4m3, one scale per output channel); "
                         "FP8 checkpoints (compressed-tensors) load as FP8 without it")
    ap.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default=None,
                    help="native: fp8 stores K/V as e4m3 (half the KV memory of bf16); default: the model's dtype")
    ap.add_argument("--kv-cache-memory", default=None, metavar="SIZE",
                    help="native: each model's KV cache (e.g. 2GiB, 512MiB; a bare number is GiB), reserved at "
                         "start; default: 2 GiB per model on the CPU (serve reserves it at start), planned from "
                         "--memory-fraction on CUDA")


UNITS = {"": 1.0, "g": 1.0, "gb": 1.0, "gib": 1.0, "m": 2**-10, "mb": 2**-10, "mib": 2**-10, "t": 2**10, "tb": 2**10,
         "tib": 2**10}  # in GiB; GB and MB read as GiB and MiB, as vLLM's KV space does


def parse_memory(text: object) -> float:
    """--kv-cache-memory's SIZE in GiB; a clear error naming the flag for what is not a size > 0."""
    import re
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = UNITS.get(match.group(2).lower()) if match else None
    if match is None or not unit or not float(match.group(1)) > 0:
        raise ValueError(f"--kv-cache-memory must be a size > 0 such as 2GiB, 512MiB or 1.5 (GiB), got {text!r}")
    return float(match.group(1)) * unit


def split_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options of add_model_split_args's flags that were given."""
    names = ("tensor_parallel_size", "quantization", "kv_cache_dtype")
    kwargs = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    if getattr(args, "kv_cache_memory", None) is not None:
        kwargs["kv_cache_gib"] = parse_memory(args.kv_cache_memory)
    if kwargs.get("tensor_parallel_size", 1) < 1:
        raise ValueError(f"--tensor-parallel-size must be >= 1, got {kwargs['tensor_parallel_size']}")
    return kwargs


def pool_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """LLMPool's kwargs from a run's flags: the engine's (native, hf) or the server's (openai); and Ray's."""
    ray = getattr(args, "ray", None)
    if ray is None:
        for flag in ("ray_replicas", "ray_gpus_per_replica"):
            if getattr(args, flag, None) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} is for --ray")
    else:
        _check_ray(args.backend, args.ray_replicas, args.ray_gpus_per_replica)  # before anything loads
    if args.backend != "openai":
        if getattr(args, "base_url", None) is not None:
            raise ValueError("--base-url is for --backend openai")
        kwargs = {k: v for k, v in (("device", args.device), ("dtype", args.dtype)) if v is not None}
        fraction, eager = getattr(args, "memory_fraction", None), getattr(args, "enforce_eager", False)
        speculative = getattr(args, "num_speculative_tokens", None)
        split = split_kwargs(args)
        if args.backend != "native" and (fraction is not None or eager or speculative is not None or split):
            raise ValueError(f"--memory-fraction, --enforce-eager, --num-speculative-tokens, --tensor-parallel-size, "
                             f"--quantization, --kv-cache-dtype and --kv-cache-memory are for --backend native, "
                             f"not {args.backend}")
        kwargs.update(split)
        if speculative is not None:
            if speculative < 0:
                raise ValueError(f"--num-speculative-tokens must be >= 0, got {speculative}")
            kwargs["num_speculative_tokens"] = speculative
        if fraction is not None:
            if not 0 < fraction <= 1:
                raise ValueError(f"--memory-fraction must be in (0, 1], got {fraction}")
            kwargs["memory_fraction"] = fraction
        if eager:
            kwargs["enforce_eager"] = True
        if ray is not None:
            kwargs.update(ray=ray, ray_replicas=args.ray_replicas, ray_gpus_per_replica=args.ray_gpus_per_replica)
        return kwargs
    for flag in ("memory_fraction", "enforce_eager", "num_speculative_tokens", "tensor_parallel_size", "quantization",
                 "kv_cache_dtype", "kv_cache_memory"):
        if getattr(args, flag, None) not in (None, False):
            raise ValueError(f"--{flag.replace('_', '-')} is for --backend native: the server plans its own memory")
    if not getattr(args, "base_url", None):
        raise ValueError("--backend openai needs --base-url URL (the server, e.g. http://127.0.0.1:8000)")
    name = args.api_key_env or "OPENAI_API_KEY"
    if name != "OPENAI_API_KEY" and name not in os.environ:  # named on purpose: not silently keyless
        raise ValueError(f"--api-key-env {name}: no such environment variable is set")
    return {"base_url": args.base_url, "api_key": os.environ.get(name)}


def check_models(args: argparse.Namespace, names: Iterable[str | None]) -> None:
    """Fail on a model the run cannot get, before anything loads: resolved here (native, hf) or in the
    server's model list (openai)."""
    kwargs = pool_kwargs(args)
    if args.backend == "openai":
        check_openai_models(kwargs["base_url"], kwargs["api_key"], names)
        return
    for name in dict.fromkeys(names):
        check_model(name)


__all__ = ["BACKENDS", "LOCAL_BACKENDS", "LLM", "Completion", "LLMPool", "PLACEMENT", "SamplingParams",
           "add_backend_args", "add_model_split_args", "check_model", "check_models", "check_openai_models", "current_placement", "load_llm",
           "pool_kwargs", "split_kwargs"]
