"""The LLM interface on Ray: engines as Ray actors, one per model replica, on any GPUs of a cluster.

    with LLMPool("native", ray=True, ray_replicas=2, device="cpu") as pool:   # or ray="HOST:6379"
        llm = pool.get("smollm2-135m")        # a RayLLM: two replicas, each a NativeLLM in an actor
        run_rr_experiment("rrmaj", tasks, llm, ...)

A replica is an async actor (ReplicaEngine): its event loop serves many calls at once, so the calls that
one instance makes together (SAC's scoring of every neighbour) still meet in one engine step. The driver
renders prompts to token ids (the model's tokenizer is loaded here too), so every replica gets exactly the
tokens one process would; per-request seeds make the tokens independent of the batch and of the replica.

Scheduling (Placement): the experiment runner binds each problem instance, for its whole life, to one
replica of every model (the one with the fewest instances in flight, at most `concurrency` each) and runs
it under that Binding, a context variable that every coroutine of the instance inherits. A session lives
in the replica that opened it; its driver-side handle names the replica. Calls made outside a run go to
the least busy replica, call by call.

A replica that dies (actor killed, node lost) fails the calls in flight on it (ReplicaLost) and marks
their instances' bindings lost; the runner runs those instances again on the others (a protocol that
catches the error, as SAC's scoring does, cannot hide it: the binding says lost). A dead replica is
started again, up to MAX_RESTARTS times for its slot, and joins when its model has loaded.
"""
from __future__ import annotations

import asyncio
import contextvars
import itertools
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..engine.loader import load_tokenizer, resolve_model
from .base import LLM, Completion, TokenSession
from ..engine.sampling import SamplingParams

BINDING = contextvars.ContextVar("byzantium_ray_binding", default=None)
MAX_RESTARTS = 2  # per replica slot: a replica that keeps dying is a problem to report, not to loop on
START_TIMEOUT = 900.0  # seconds a restarted replica may take to load (a lost node may never come back)
POLL = 0.05  # seconds between looks for a free replica (instances last seconds; this costs nothing)


class ReplicaLost(RuntimeError):
    """A call whose replica died (or no replica of its model is left); the instance runs again."""


def _lost_errors():
    import ray.exceptions as e
    return (e.RayActorError, e.NodeDiedError, e.WorkerCrashedError, e.ObjectLostError)


# -- the actor -------------------------------------------------------------------------------------------

class ReplicaEngine:
    """One model replica: a NativeLLM in a Ray actor. Every reply carries the engine's counters, so the
    driver knows each replica's tokens without asking (and still knows them after it died)."""

    def __init__(self, model, engine_kwargs):
        from .native import NativeLLM
        self.llm = NativeLLM(resolve_model(model), model, **engine_kwargs)  # resolved on this node
        self.sessions, self.ids = {}, itertools.count()

    async def ready(self):
        import ray
        from ray.util import get_node_ip_address
        return {"node": ray.get_runtime_context().get_node_id(), "ip": get_node_ip_address(),
                "engine": self.llm.describe()}

    def _counters(self):
        return {k: v for k, v in self.llm.stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    async def generate(self, ids, params, tag):
        return await self.llm._generate(ids, params, tag=tag), self._counters()

    async def logprobs(self, ids, tag):
        return await self.llm._logprobs(ids, tag=tag), self._counters()

    async def open_session(self, ids):
        sid = next(self.ids)
        self.sessions[sid] = await self.llm.open_session(ids)
        return sid, self._counters()

    async def extend(self, sid, ids):
        return await self.llm.extend(self.sessions[sid], ids), self._counters()

    async def continue_(self, sid, params, tag):
        return await self.llm.continue_(self.sessions[sid], params, tag=tag), self._counters()

    async def close_session(self, sid):
        session = self.sessions.pop(sid, None)
        if session is not None:
            await self.llm.close_session(session)
        return None, self._counters()

    async def stats(self):
        return self.llm.stats

    async def reset_stats(self):
        self.llm.reset_stats()


# -- the driver's side -----------------------------------------------------------------------------------

@dataclass(eq=False)
class Replica:
    id: str  # "<model>/<slot>", "/r<n>" added for a restart
    llm: "RayLLM"
    slot: int
    actor: object
    ready: object  # the ObjectRef of actor.ready() until the model has loaded, then None
    started: float = field(default_factory=time.monotonic)
    restarts: int = 0
    alive: bool = False
    node: str | None = None
    ip: str | None = None
    engine: dict = field(default_factory=dict)
    instances: int = 0  # instances bound to it now
    calls: int = 0  # calls in flight
    tokens: int = 0  # tokens generated, as counted on the driver (progress)
    counters: dict = field(default_factory=dict)  # the engine's counters, as of its latest reply


class RaySession(TokenSession):
    """A session on the driver: the replica that holds it, its id there, and its token ids."""

    def __init__(self, replica, sid, ids):
        super().__init__(ids)
        self.replica, self.sid = replica, sid

    def __repr__(self):
        return f"RaySession({self.replica.id}#{self.sid}, tokens={len(self.ids)}, closed={self.closed})"


class Binding:
    """One attempt of one instance: the replica of each model it runs on; `lost` once a call of it met a
    dead replica (the attempt's result is then not trusted, even when the protocol swallowed the error)."""

    def __init__(self, replicas):
        self.replicas, self.lost = replicas, False  # RayLLM -> Replica

    @contextmanager
    def active(self):
        token = BINDING.set(self)
        try:
            yield self
        finally:
            BINDING.reset(token)

    def replica(self, llm):
        if llm not in self.replicas:  # a model the placement did not know when the instance started
            self.replicas[llm] = llm.placement.least_busy(llm)
            self.replicas[llm].instances += 1
        return self.replicas[llm]


class RayLLM(LLM):
    """One model on its replicas; every call is an awaited remote call on ONE of them."""

    def __init__(self, placement, model, name, replicas, engine_kwargs):
        self.placement, self.model, self.name = placement, model, name
        self.model_dir = resolve_model(model)  # the driver's copy, for the tokenizer; replicas resolve their own
        self.tokenizer = load_tokenizer(self.model_dir)
        self.engine_kwargs = dict(engine_kwargs)
        self.replicas = []
        for slot in range(replicas):
            self.start_replica(slot)

    def start_replica(self, slot, restarts=0):
        import ray
        p = self.placement
        cpus, gpus = p.resources(self.engine_kwargs.get("tensor_parallel_size", 1))
        actor = ray.remote(ReplicaEngine).options(
            num_cpus=cpus, num_gpus=gpus, max_restarts=0,
            max_concurrency=100_000,  # an async actor: concurrent coroutines, all feeding one engine
        ).remote(self.model, self.engine_kwargs)
        suffix = f"/r{restarts}" if restarts else ""
        replica = Replica(f"{self.name}/{slot}{suffix}", self, slot, actor, actor.ready.remote(), restarts=restarts)
        self.replicas.append(replica)
        return replica

    # -- routing and calls -----------------------------------------------------------------------------
    def _route(self):
        binding = BINDING.get()
        return binding.replica(self) if binding is not None else self.placement.least_busy(self)

    async def _call(self, replica, method, *args):
        import ray
        binding = BINDING.get()
        if not replica.alive:
            return self._lose(replica, binding, None)
        replica.calls += 1
        ref = getattr(replica.actor, method).remote(*args)
        try:
            result, counters = await ref
        except ray.exceptions.RayTaskError as error:  # the engine raised: the same error as in one process
            raise error.cause from None
        except _lost_errors() as error:
            return self._lose(replica, binding, error)
        except asyncio.CancelledError:
            ray.cancel(ref)  # the caller is gone (Ctrl-C, a timeout): the replica aborts the request
            raise
        finally:
            replica.calls -= 1
        if counters.get("steps", 0) >= replica.counters.get("steps", 0):  # replies may arrive out of order
            replica.counters = counters
        if isinstance(result, Completion):
            replica.tokens += len(result.token_ids)
        return result

    def _lose(self, replica, binding, error):
        self.placement.died(replica, error)
        if binding is not None:
            binding.lost = True
        raise ReplicaLost(f"replica {replica.id} of {self.name!r} died"
                          + (f" ({type(error).__name__})" if error is not None else "")) from error

    # -- the LLM interface -----------------------------------------------------------------------------
    async def _generate(self, ids, params, tag=None):
        return await self._call(self._route(), "generate", list(ids), params, tag)

    async def _logprobs(self, ids, tag=None):
        return await self._call(self._route(), "logprobs", list(ids), tag)

    async def open_session(self, prompt, untrusted=False):
        ids = self.prompt_ids(prompt, untrusted)
        replica = self._route()
        return RaySession(replica, await self._call(replica, "open_session", ids), ids)

    async def extend(self, session, tokens_or_text):
        if session.closed:
            raise ValueError("extend on a closed session")
        ids = self.encode_plain(tokens_or_text) if isinstance(tokens_or_text, str) else [int(t) for t in tokens_or_text]
        await self._call(session.replica, "extend", session.sid, ids)
        session.ids += ids
        return session.num_tokens

    async def continue_(self, session, params=None, tag=None):
        if session.closed:
            raise ValueError("continue_ on a closed session")
        out = await self._call(session.replica, "continue_", session.sid, params or SamplingParams(), tag)
        session.ids += out.token_ids
        return out

    async def close_session(self, session):
        if session.closed:
            return
        session.closed = True
        if session.replica.alive:  # a dead replica took its sessions with it
            try:
                await self._call(session.replica, "close_session", session.sid)
            except ReplicaLost:
                pass

    # -- bookkeeping -----------------------------------------------------------------------------------
    @property
    def stats(self):
        """The engines' counters summed over the replicas (a dead one: as of its last reply); max_* the
        largest; rates recomputed from the sums."""
        total = {}
        for r in self.replicas:
            for k, v in r.counters.items():
                total[k] = max(total.get(k, 0), v) if k.startswith("max_") else total.get(k, 0) + v
        for phase in ("prefill", "decode"):
            seconds = total.get(f"{phase}_seconds", 0)
            total[f"{phase}_tok_per_s"] = total.get(f"{phase}_tokens", 0) / seconds if seconds else 0.0
        total["replicas"] = sum(r.alive for r in self.replicas)
        return total

    def reset_stats(self):
        import ray
        ray.get([r.actor.reset_stats.remote() for r in self.replicas if r.alive])
        for r in self.replicas:
            r.counters = {}

    def describe(self):
        first = next((r for r in self.replicas if r.engine), None)
        return {**(first.engine if first else {"model": self.name}), "backend": "ray",  # native engines on Ray
                "replicas": [{"id": r.id, "node": r.node, "alive": r.alive} for r in self.replicas]}

    def close(self):
        import ray
        for r in self.replicas:
            try:
                ray.kill(r.actor)
            except Exception:  # already gone (killed, its node lost)
                pass
            r.alive = False


__all__ = ["BINDING", "Binding", "RayLLM", "RaySession", "Replica", "ReplicaEngine", "ReplicaLost"]
