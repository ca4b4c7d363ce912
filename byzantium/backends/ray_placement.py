"""The Ray pool's placement of replicas: starting Ray or joining a cluster, loading every model's replicas,
restarting those that die, and binding each problem instance to one replica of every model (see
ray_engines.py for how calls then reach them)."""
from __future__ import annotations

import asyncio
import logging
import sys
import time

from ..engine.loader import resolve_model
from .ray_engines import MAX_RESTARTS, POLL, START_TIMEOUT, Binding, RayLLM, ReplicaLost


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

    def replicas_per_model(self, tensor_parallel_size=1):
        import ray
        if self.replicas is not None:
            return self.replicas
        if not self.gpus_per_replica:
            return 1  # on CPU one replica; more with --ray-replicas
        each = self.gpus_per_replica * tensor_parallel_size
        return max(1, int(ray.cluster_resources().get("GPU", 0) / each) // self.models)

    def resources(self, tensor_parallel_size=1):
        """(CPUs, GPUs) of one replica: a tensor-parallel group is one actor holding all its ranks' GPUs, so
        Ray places it on one node (an actor never spans nodes), its ranks one process each in it."""
        return self.cpus_per_replica * tensor_parallel_size, self.gpus_per_replica * tensor_parallel_size

    def add(self, model, name, engine_kwargs):
        """A RayLLM for `model`; its replicas loaded (a model that fails to load fails here)."""
        kwargs = dict(engine_kwargs)
        if not self.gpus_per_replica:
            kwargs.setdefault("device", "cpu")
        elif self.gpus_per_replica < 1 and not any(k in kwargs for k in ("num_blocks", "kv_cache_gib", "memory_fraction")):
            from ..engine.memory import DEFAULT_MEMORY_FRACTION
            kwargs["memory_fraction"] = DEFAULT_MEMORY_FRACTION * self.gpus_per_replica  # its share of the GPU
        tp = kwargs.get("tensor_parallel_size", 1)
        self.check_fits(self.replicas_per_model(tp), tp)
        llm = RayLLM(self, model, name, self.replicas_per_model(tp), kwargs)
        self.llms.append(llm)
        self.wait(llm.replicas)
        return llm

    def check_fits(self, replicas, tensor_parallel_size=1):
        """Refuse replicas the whole cluster could never hold (Ray would keep them pending forever)."""
        import ray
        have = ray.cluster_resources()
        held = [self.resources(llm.engine_kwargs.get("tensor_parallel_size", 1)) for llm in self.llms
                for r in llm.replicas if r.alive or r.ready is not None]  # this pool's
        new = self.resources(tensor_parallel_size)
        for index, resource in enumerate(("CPU", "GPU")):
            need = replicas * new[index] + sum(h[index] for h in held)
            if new[index] and need > have.get(resource, 0) + 1e-9:
                raise ValueError(f"{replicas} replicas need {need:g} {resource}s with this pool's others; the Ray "
                                 f"cluster has {have.get(resource, 0):g} (lower --ray-replicas)")

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
            new = replica.llm.start_replica(replica.slot, replica.restarts + 1)
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


__all__ = ["Placement"]
