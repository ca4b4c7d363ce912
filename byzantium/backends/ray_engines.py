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
import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..engine.loader import load_tokenizer, resolve_model
from .base import LLM, Completion, TokenSession
from .params import SamplingParams

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
            self._start(slot)

    def _start(self, slot, restarts=0):
        import ray
        p = self.placement
        actor = ray.remote(ReplicaEngine).options(
            num_cpus=p.cpus_per_replica, num_gpus=p.gpus_per_replica, max_restarts=0,
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


class Placement:
    """The Ray pool's side of a run: starts Ray (or joins a cluster), holds every model's replicas, and
    binds instances to them. `address`: None starts a local instance (or joins the one `ray start` runs
    here), else the cluster's address."""

    name = "ray"  # the key of its report in summary.json

    def __init__(self, address=None, replicas=None, gpus_per_replica=None):
        import ray
        self.started = not ray.is_initialized()  # a Ray the caller started (a test, a notebook) stays up
        if self.started:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=True)
        gpus = ray.cluster_resources().get("GPU", 0)
        self.gpus_per_replica = float(gpus_per_replica if gpus_per_replica is not None else (1 if gpus else 0))
        if self.gpus_per_replica and gpus < self.gpus_per_replica:
            if self.started:
                ray.shutdown()
            raise ValueError(f"the Ray cluster has {gpus:g} GPUs; a replica needs {self.gpus_per_replica:g}")
        self.cpus_per_replica = 1
        self.replicas, self.models = replicas, 1  # per model (None: as many as fit); models planned
        self.llms = []

    def plan(self, models):
        """The models the run will load (their number sizes the default replica count)."""
        self.models = max(1, len({resolve_model(m) for m in models}))

    def replicas_per_model(self):
        import ray
        if self.replicas is not None:
            return self.replicas
        if not self.gpus_per_replica:
            return 1  # on CPU one replica; more with --ray-replicas
        return max(1, int(ray.cluster_resources().get("GPU", 0) / self.gpus_per_replica) // self.models)

    def add(self, model, name, engine_kwargs):
        """A RayLLM for `model`; its replicas loaded (a model that fails to load fails here)."""
        kwargs = dict(engine_kwargs)
        if not self.gpus_per_replica:
            kwargs.setdefault("device", "cpu")
        elif self.gpus_per_replica < 1 and not any(k in kwargs for k in ("num_blocks", "kv_cache_gib", "memory_fraction")):
            from ..engine.memory import DEFAULT_MEMORY_FRACTION
            kwargs["memory_fraction"] = DEFAULT_MEMORY_FRACTION * self.gpus_per_replica  # its share of the GPU
        self.check_fits(self.replicas_per_model())
        llm = RayLLM(self, model, name, self.replicas_per_model(), kwargs)
        self.llms.append(llm)
        self.wait(llm.replicas)
        return llm

    def check_fits(self, replicas):
        """Refuse replicas the whole cluster could never hold (Ray would keep them pending forever)."""
        import ray
        have = ray.cluster_resources()
        replicas += sum(r.alive or r.ready is not None for llm in self.llms for r in llm.replicas)  # this pool's
        for resource, each in (("CPU", self.cpus_per_replica), ("GPU", self.gpus_per_replica)):
            if each and replicas * each > have.get(resource, 0) + 1e-9:
                raise ValueError(f"{replicas} replicas need {replicas * each:g} {resource}s; the Ray cluster has "
                                 f"{have.get(resource, 0):g} (lower --ray-replicas)")

    def wait(self, replicas):
        import ray
        ray.wait([r.ready for r in replicas], num_returns=len(replicas), timeout=START_TIMEOUT)
        self.poll(raise_errors=True)

    def poll(self, raise_errors=False):
        """Replicas whose model has loaded join; one whose start failed is dropped (or raises, at start)."""
        import ray
        starting = [r for llm in self.llms for r in llm.replicas if r.ready is not None]
        if not starting:
            return
        done, _ = ray.wait([r.ready for r in starting], num_returns=len(starting), timeout=0)
        done = set(done)
        for r in starting:
            if r.ready in done:
                ref, r.ready = r.ready, None
                try:
                    info = ray.get(ref)
                except Exception as error:
                    if raise_errors:
                        raise
                    print(f"byzantium: replica {r.id} did not start ({type(error).__name__}: {error}); "
                          f"going on without it", file=sys.stderr)
                    continue
                r.node, r.ip, r.engine, r.alive = info["node"], info["ip"], info["engine"], True
            elif time.monotonic() - r.started > START_TIMEOUT:  # e.g. no node has the resources any more
                r.ready = None
                ray.kill(r.actor)
                if raise_errors:
                    raise RuntimeError(f"replica {r.id} did not start in {START_TIMEOUT:.0f} s")
                print(f"byzantium: replica {r.id} did not start in {START_TIMEOUT:.0f} s; going on without it",
                      file=sys.stderr)

    def died(self, replica, error):
        """A call met `replica` dead: it takes no more instances; its slot starts again if it may."""
        if not replica.alive:
            return
        replica.alive = False
        why = f" ({type(error).__name__})" if error is not None else ""
        if replica.restarts < MAX_RESTARTS:
            new = replica.llm._start(replica.slot, replica.restarts + 1)
            print(f"byzantium: replica {replica.id} died{why}; its instances run again elsewhere; "
                  f"starting {new.id}", file=sys.stderr)
        else:
            print(f"byzantium: replica {replica.id} died{why}; going on without it", file=sys.stderr)

    def _alive(self, llm):
        alive = [r for r in llm.replicas if r.alive]
        if not alive and not any(r.ready is not None for r in llm.replicas):
            raise ReplicaLost(f"no replica of {llm.name!r} is left")
        return alive

    def least_busy(self, llm):
        """The replica for a call made outside any instance's binding."""
        self.poll()
        alive = self._alive(llm)
        if not alive:
            raise ReplicaLost(f"no replica of {llm.name!r} is up (one is starting)")
        return min(alive, key=lambda r: (r.instances, r.calls))

    async def acquire(self, limit):
        """A Binding of a new instance: for every model, the replica with the fewest instances in flight,
        once one has fewer than `limit`."""
        while True:
            self.poll()
            choice = {}
            for llm in self.llms:
                alive = self._alive(llm)
                best = min(alive, key=lambda r: r.instances, default=None)
                if best is None or best.instances >= limit:
                    break
                choice[llm] = best
            else:
                for r in choice.values():
                    r.instances += 1
                return Binding(choice)
            await asyncio.sleep(POLL)

    def release(self, binding):
        for r in binding.replicas.values():
            r.instances -= 1

    def tokens(self):
        return {r.id: r.tokens for llm in self.llms for r in llm.replicas}

    def replica_list(self):
        return [r for llm in self.llms for r in llm.replicas]

    def close(self):
        import ray
        for llm in self.llms:
            llm.close()
        self.llms.clear()
        if self.started and ray.is_initialized():
            ray.shutdown()


__all__ = ["BINDING", "Binding", "Placement", "RayLLM", "RaySession", "Replica", "ReplicaEngine", "ReplicaLost"]
