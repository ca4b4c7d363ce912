"""Tensor parallelism across processes, one rank each.

Rank 0 is the engine's own process: the scheduler, the sampling and the requests live there only. The
engine starts ranks 1..N-1 as worker processes; each builds its slice of the model (layers/parallel.py)
and, when told, its slice of the KV cache. Every step, once rank 0 has planned it, the other ranks get
the plan (runner.StepPlan, plain lists, broadcast over a CPU group) and all ranks run the same forward
pass; the layers' sums (all_reduce) meet inside it. Only rank 0 reads the logits. The collectives run on
NCCL on CUDA (rank r on the r-th GPU from the engine's) and on gloo on the CPU.

A rank that dies (killed, out of memory, an error in its step) ends the engine: its socket closes, the
next collective on rank 0 raises, and the error names the rank and how it ended. A watchdog also notices
a dead worker between steps, and on CUDA aborts the NCCL group so that rank 0 is not left waiting.
"""
import atexit
import logging
import os
import pickle
import sys
import threading
import time
import traceback
import weakref
from datetime import timedelta
from functools import partial
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .cache_setup import build_pool_and_runner
from .failures import EngineFailed
from .layers import parallel
from .model_setup import load_model
from .models import model_class

logger = logging.getLogger("byzantium")

ASKED = ("kv_cache",)  # instructions every rank answers (Peers.ask)
TIMEOUT = timedelta(minutes=10)  # a collective that waits longer fails (a rank stuck, not dead)
_OPEN = weakref.WeakSet()  # Peers not closed yet: closed at interpreter exit


@atexit.register
def _close_at_exit():
    """An engine left open at exit: stop its ranks with "exit" before multiprocessing's own exit handler
    (registered earlier, so run later) terminates them, which the watchdog would report as a killed rank
    while the interpreter tears down the process group under it."""
    for peers in list(_OPEN):
        peers.close()


def rank_device(device, rank):
    """Rank r's device: the r-th GPU from the engine's own; the CPU for every rank on the CPU."""
    if device.type != "cuda":
        return device
    index = (device.index or 0) + rank
    if index >= torch.cuda.device_count():
        raise ValueError(f"tensor_parallel_size needs GPUs {device.index or 0}..{index}; torch sees "
                         f"{torch.cuda.device_count()}")
    return torch.device("cuda", index)


def cpu_threads(size):
    """Each rank's share of the cores (ranks on one CPU would otherwise oversubscribe it)."""
    return max(1, (os.cpu_count() or 1) // size)


def _connect(store, rank, size, device, group):
    """This rank's process groups for one engine, made on the engine's own store (not torch.distributed's
    global default group, so several tensor-parallel engines can live in one process): gloo for the step
    plans, and for the sums NCCL on CUDA (gloo on the CPU). Returns the plans' group."""
    plans = dist.ProcessGroupGloo(dist.PrefixStore("plans/", store), rank, size, TIMEOUT)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = TIMEOUT
        group.backend = dist.ProcessGroupNCCL(dist.PrefixStore("sums/", store), rank, size, options)
    else:
        group.backend = plans  # one gloo group serves both: every rank calls them in the same order
    return plans


def _send(plans, message, root=0):
    data = pickle.dumps(message)
    plans.broadcast(torch.tensor([len(data)]), root).wait()
    plans.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), root).wait()


def _receive(plans, root=0):
    length = torch.zeros(1, dtype=torch.int64)
    plans.broadcast(length, root).wait()
    data = torch.empty(int(length), dtype=torch.uint8)
    plans.broadcast(data, root).wait()
    return pickle.loads(data.numpy().tobytes())


def _answers(plans, rank, size, answer):
    """Every rank but 0 broadcasts its answer in turn; each rank takes the others'. Returns them by rank."""
    answers = {}
    for speaker in range(1, size):
        if speaker == rank:
            _send(plans, answer, root=speaker)
            answers[speaker] = answer
        else:
            answers[speaker] = _receive(plans, root=speaker)
    return answers


class Peers:
    """Rank 0's handle on the other ranks: starts them, tells them each step, and stops them."""

    def __init__(self, group, device, build):
        """group: rank 0's parallel.Group, which the model was built with (its backend is set here).
        build(rank, device): what a worker runs to make its RankWorker (picklable: a functools.partial of
        a module function). Returns once every rank has joined (the workers then load their slices)."""
        size = group.size
        self.closing, self.failure = False, None
        self.threads = torch.get_num_threads()  # this process's, given back on close
        if device.type == "cpu":
            torch.set_num_threads(cpu_threads(size))
        self.store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
        context = mp.get_context("spawn")
        self.workers = {}
        for rank in range(1, size):
            process = context.Process(target=worker_main,
                                      args=(rank, size, self.store.port, rank_device(device, rank), build),
                                      name=f"byzantium-tp-rank{rank}", daemon=True)
            process.start()
            self.workers[rank] = process
        _OPEN.add(self)
        self.group, self.nccl = group, device.type == "cuda"
        self.plans = self._join_watching(lambda: _connect(self.store, 0, size, rank_device(device, 0), group))
        threading.Thread(target=self._watch, name="byzantium-tp-watchdog", daemon=True).start()

    def _join_watching(self, connect):
        """connect() (which waits for every rank to join), failing at once when a rank ends before joining
        (it could not start: its traceback is on stderr) rather than after the collectives' timeout."""
        outcome = {}

        def run():
            try:
                outcome["plans"] = connect()
            except Exception as error:  # noqa: BLE001 - raised below, on the engine's thread
                outcome["error"] = error

        joining = threading.Thread(target=run, name="byzantium-tp-join", daemon=True)
        joining.start()
        while joining.is_alive():
            joining.join(timeout=0.1)
            ended = [rank for rank, p in self.workers.items() if p.exitcode is not None]
            if ended and joining.is_alive():
                for process in self.workers.values():
                    process.kill()
                rank = ended[0]
                raise EngineFailed(f"tensor-parallel rank {rank} ended before joining ({_ending(self.workers[rank])}); "
                                   f"its error is above")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["plans"]

    def tell(self, kind, payload=None):
        """Send every other rank one instruction: ("run", StepPlan), ("copy_block", (src, dst)),
        ("build_cache", (EngineConfig, num_blocks)), one of ASKED (through ask) or ("exit", None)."""
        self.check()
        try:
            _send(self.plans, (kind, payload))
        except Exception as error:  # noqa: BLE001 - a peer gone: named below
            raise self.died(error) from error

    def ask(self, kind):
        """Each other rank's answer to `kind` ("kv_cache": its pool's kv_pool_facts), by rank."""
        self.tell(kind)
        try:
            return _answers(self.plans, 0, len(self.workers) + 1, None)
        except Exception as error:  # noqa: BLE001 - a peer gone: named below
            raise self.died(error) from error

    def together(self, kind, payload, local):
        """tell(kind, payload), then run `local()` here (its collectives meet the other ranks')."""
        self.tell(kind, payload)
        try:
            return local()
        except EngineFailed:
            raise
        except Exception as error:  # noqa: BLE001 - a rank's error mid-pass leaves the others in a collective
            raise self.died(error) from error

    def check(self):
        if self.failure is not None:
            raise EngineFailed(self.failure)

    def died(self, error):
        """The engine's end after a collective failed: which ranks are gone (waiting a moment for their exit)."""
        deadline = time.monotonic() + 5  # a rank that died has its exit code read in a moment (or by the watchdog)
        while time.monotonic() < deadline and all(p.exitcode is None for p in self.workers.values()):
            time.sleep(0.05)
        gone = [f"rank {rank} ({_ending(p)})" for rank, p in self.workers.items() if p.exitcode is not None]
        where = ", ".join(gone) if gone else "no rank has exited"
        self.failure = (f"tensor parallelism failed: {where}; the engine cannot go on "
                        f"({type(error).__name__}: {str(error)[:200]})")
        return EngineFailed(self.failure)

    def _watch(self):
        """Between steps: notice a worker that ended while the engine still runs."""
        sentinels = {p.sentinel: rank for rank, p in self.workers.items()}
        ready = wait(list(sentinels))
        if self.closing or not ready:
            return
        rank = sentinels[ready[0]]
        self.workers[rank].join(timeout=5)  # its exit code is set once it is joined
        self.failure = f"tensor-parallel rank {rank} ended ({_ending(self.workers[rank])}); the engine cannot go on"
        logger.error("byzantium: %s", self.failure)
        abort = getattr(self.group.backend, "abort", None)
        if self.nccl and abort is not None:  # NCCL would wait for the dead rank: abort, so rank 0's collective raises
            try:
                abort()
            except Exception:  # noqa: BLE001 - best effort; the collective timeout remains
                pass

    def close(self):
        """Stop the workers (they exit on "exit"; any still alive after a while is killed)."""
        if self.closing:
            return
        self.closing = True
        _OPEN.discard(self)
        if self.failure is None:
            try:
                _send(self.plans, ("exit", None))
            except Exception:  # noqa: BLE001 - a peer already gone: killed below
                pass
        for process in self.workers.values():
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        torch.set_num_threads(self.threads)


def _ending(process):
    code = process.exitcode
    if code is None:
        return "still running"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def worker_main(rank, size, port, device, build):
    """A worker rank: join the group, build this rank's model, then follow rank 0's instructions."""
    if os.environ.get("BYZANTIUM_LINEAR_KERNELS") == "measure":
        del os.environ["BYZANTIUM_LINEAR_KERNELS"]  # rank 0 measured: the cache it wrote gives its choices here
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads(size))
    else:
        torch.cuda.set_device(device)
    try:
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=TIMEOUT)
        group = parallel.Group(rank, size)
        plans = _connect(store, rank, size, device, group)
        with parallel.using(group):  # the model's slice is this rank's
            worker = build(rank, device)
        while True:
            kind, payload = _receive(plans)
            if kind == "exit":
                break
            answer = worker.follow(kind, payload)
            if kind in ASKED:
                _answers(plans, rank, size, answer)
    except Exception:  # noqa: BLE001 - the rank ends; rank 0 names it
        print(f"byzantium: tensor-parallel rank {rank} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(1)


class RankWorker:
    """A worker rank's slice of the model, and of the KV cache with its runner once rank 0 sizes it."""

    def __init__(self, model, device):
        self.model, self.device, self.runner, self.kv_cache = model, device, None, None

    def follow(self, kind, payload):
        """Do what rank 0 said; an answer (to Peers.ask) is returned."""
        if kind == "run":
            self.runner.execute(payload)
        elif kind == "copy_block":
            self.runner.copy_block(*payload)
        elif kind == "build_cache":  # (the engine's resolved config, the blocks it planned)
            config, num_blocks = payload
            self.kv_cache = self.runner = None  # the old pool goes before the new one is allocated
            self.kv_cache, self.runner = build_pool_and_runner(self.model, config, num_blocks, self.device)
        elif kind == "kv_cache":
            return kv_pool_facts(self.kv_cache)
        else:
            raise ValueError(f"unknown instruction {kind!r} from rank 0")


def kv_pool_facts(kv_cache):
    """What a rank's pool is: its blocks, its bytes and where it starts in the rank's memory."""
    return {"num_blocks": kv_cache.shape[2], "bytes": kv_cache.numel() * kv_cache.element_size(),
            "address": kv_cache.data_ptr()}


def start_ranks(group, model_dir, engine_config):
    """Ranks 1..N-1 of `group`, each loading its slice of the model as rank 0 did (rank 0's Peers)."""
    return Peers(group, engine_config.device, partial(build_rank, model_dir, engine_config))


def build_rank(model_dir, engine_config, rank, device):
    """A worker's RankWorker: its slice of the checkpoint's model, built as rank 0 built its own."""
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(model_dir)
    model = load_model(model_class(config), config, model_dir, engine_config.dtype, device, engine_config).model
    return RankWorker(model, device)
