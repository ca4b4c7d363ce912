"""Which CPU linear kernel runs each weight shape, chosen by timing the candidates on this machine.

A kernel tuned on one CPU can lose on another (a hand-written AVX2 GEMM beats oneDNN for decode rows on
a machine without AVX-512 and loses to it at prefill on one with AVX-512), so nothing here is a constant:
for each (in_features, out_features) shape of a model and each phase of a step, the candidates are timed
once per machine and the winner is cached in $BYZANTIUM_CACHE/linear_choice.json, keyed by the CPU, the
thread count, the torch version and the kernels' sources (a changed kernel is timed again).

The kernels decide the rounding, and so a sampled transcript: on one machine every process must use the
same ones, however busy the machine was when it started. So a choice, once made, is kept: when another
process had the cores while timing (twice), the first admitted candidate (the panel GEMM for the CPU's
instruction set) is chosen and cached too, marked "busy"; `BYZANTIUM_LINEAR_KERNELS=measure` on a quiet
machine times every shape again and replaces what the cache holds.

Both phases are timed: decode rows (one token per request, at 1, 8 and 32 rows with the weights
streamed from memory) and prefill rows (PREFILL_ROWS rows); each shape then takes the one kernel with
the lowest sum. Not a kernel per phase, nor per row count: a token's K/V must be the same whether a
decode or a prefill pass computed it (sessions, prefix-cache hits and replays reuse them across phases),
and a request's tokens must not depend on the batch it lands in. Only candidates whose output row does
not depend on how many rows share the call are admitted (checked here, per shape).
"""
import contextlib
import fcntl
import json
import os
import platform
import time
from pathlib import Path

import torch

from ..paths import cache_root
from .notices import warn_once

DECODE_ROWS = (1, 8, 32)
PREFILL_ROWS = 256
STREAM_BYTES = 96 * 2**20  # decode timing cycles through this many weight bytes: more than a CPU's caches
BATCH_HINT = 32  # oneDNN picks its blocking for this batch; measured best across batch 1..512
ROUNDS = 5  # interleaved timing rounds per row count
NOISE = 1.5  # median over best above this: another process had the cores, the timings are not used
TRIES = 2  # timings of a shape before a busy machine gets the fallback
_remeasured = set()  # cache keys timed again by this process (BYZANTIUM_LINEAR_KERNELS=measure)


class Candidate:
    """One linear kernel: `pack(weight)` once, then `run(rows, packed, bias, out_features)`."""
    name = ""

    def pack(self, weight):
        raise NotImplementedError

    def run(self, rows, packed, bias, out_features):
        raise NotImplementedError


class Panels(Candidate):
    """Byzantium's panel GEMM (kernels/cpu_gemm.cpp): weights as panels of 16 output columns."""
    name = "panels"
    PANEL = 16

    def __init__(self, kernels):
        self.kernels = kernels

    def pack(self, weight):
        return self.kernels.pack_panels(weight)

    def pad_bias(self, bias, packed, out_features):  # panel_linear reads the bias in whole panels
        return torch.cat([bias, bias.new_zeros(packed.shape[0] * self.PANEL - out_features)])

    def run(self, rows, packed, bias, out_features):
        return self.kernels.panel_linear(rows, packed, bias, out_features)


class Panels512(Panels):
    """The same with AVX-512 (kernels/cpu_gemm.h at AVX-512 width): panels of 32 columns, blocks of 14 rows."""
    name = "panels512"
    PANEL = 32

    def pack(self, weight):
        return self.kernels.pack_panels512(weight)

    def run(self, rows, packed, bias, out_features):
        return self.kernels.panel_linear512(rows, packed, bias, out_features)


class PanelsBF16(Panels):
    """bf16 weights on the bf16 units where the CPU has avx512_bf16 (kernels/cpu_gemm.h on the bf16 traits): panels of 32
    columns holding (k, k + 1) weight pairs, fp32 sums rounded once; the bias is added in fp32."""
    name = "panels_bf16"
    PANEL = 32

    def pack(self, weight):
        return self.kernels.pack_panels_bf16(weight)

    def pad_bias(self, bias, packed, out_features):
        return super().pad_bias(bias.float(), packed, out_features)

    def run(self, rows, packed, bias, out_features):
        return self.kernels.panel_linear_bf16(rows, packed, bias, out_features)


class OneDNN(Candidate):
    """oneDNN's prepacked weights (the path torch.compile's CPU freezing takes)."""
    name = "onednn"

    def pack(self, weight):
        return torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)

    def run(self, rows, packed, bias, out_features):
        if rows.shape[0] == 1:  # oneDNN's one-row path rounds differently from its many-row one on some shapes
            return torch.ops.mkldnn._linear_pointwise(rows.expand(2, -1), packed, bias, "none", [], "")[:1]
        return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


class Torch(Candidate):
    """F.linear on the weight as loaded: what transformers runs (oneDNN or MKL picked per call by torch)."""
    name = "torch"

    def pack(self, weight):
        return weight.contiguous()

    def run(self, rows, packed, bias, out_features):
        return torch.nn.functional.linear(rows, packed, bias)


def candidates(kernels, onednn, dtype=torch.float32):
    """The kernels available here for `dtype`: the panel GEMM (fp32) when the CPU kernels built, its AVX-512
    variant where the CPU has AVX-512, the bf16 panels (bf16) where it has avx512_bf16, oneDNN when its
    packing works, and plain F.linear (admitted per shape only where it is batch-invariant)."""
    panels = kernels is not None and dtype == torch.float32
    bf16 = kernels is not None and dtype == torch.bfloat16 and kernels.avx512_bf16_supported()
    return [c for c, ok in ((Panels(kernels), panels), (Panels512(kernels), panels and kernels.avx512_supported()),
                            (PanelsBF16(kernels), bf16), (OneDNN(), onednn), (Torch(), True)) if ok]


def cpu_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_key():
    """The CPU, the thread count, the torch version and the compiled kernels' sources: a timing holds for these."""
    from . import cpu_ext
    return (f"{cpu_name()} | {torch.get_num_threads()} threads | torch {torch.__version__} | "
            f"kernels {cpu_ext.source_digest()}")


def batch_invariant(candidate, weight, generator):
    """Whether each output row is bitwise the same whatever the number of rows in the call."""
    rows = torch.randn(40, weight.shape[1], generator=generator).to(weight.dtype)
    packed = candidate.pack(weight)
    full = candidate.run(rows, packed, None, weight.shape[0])
    return all(torch.equal(candidate.run(rows[:m], packed, None, weight.shape[0]), full[:m]) for m in (1, 2, 3, 8, 17))


def interleaved(fns, rounds=ROUNDS):
    """{name: sorted seconds} of callables timed in turn, round after round, so that each sees the same
    conditions (another process taking the cores slows every candidate, not just one)."""
    for fn in fns.values():
        fn()  # warm-up: first-touch, oneDNN primitive creation
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: sorted(s) for name, s in samples.items()}


def noisy(samples):
    """Whether the machine was busy while timing: a median far above the best run of the same work."""
    return any(s[len(s) // 2] > NOISE * s[0] for s in samples.values())


def time_shape(candidates, weights, in_features, generator):
    """({candidate: {phase: seconds}}, noisy) on this shape: decode rows over weights streamed from memory
    (the first `weights` cycled up to STREAM_BYTES), prefill rows on one weight (compute-bound); the best
    of interleaved rounds."""
    per_weight = weights[0].numel() * weights[0].element_size()
    copies = max(1, min(64, STREAM_BYTES // per_weight))
    out, dtype = weights[0].shape[0], weights[0].dtype
    packed = {c.name: [c.pack(weights[i % len(weights)].clone()) for i in range(copies)] for c in candidates}
    seconds = {c.name: {"decode": 0.0} for c in candidates}
    busy = False
    for m in (*DECODE_ROWS, PREFILL_ROWS):
        x = torch.randn(m, in_features, generator=generator).to(dtype)
        if m == PREFILL_ROWS:
            fns = {c.name: (lambda c=c: c.run(x, packed[c.name][0], None, out)) for c in candidates}
        else:
            fns = {c.name: (lambda c=c: [c.run(x, w, None, out) for w in packed[c.name]]) for c in candidates}
        samples = interleaved(fns)
        busy = busy or noisy(samples)
        for name, s in samples.items():
            if m == PREFILL_ROWS:
                seconds[name]["prefill"] = s[0]
            else:
                seconds[name]["decode"] += s[0] / copies
    return seconds, busy


def cache_path():
    """$BYZANTIUM_KERNEL_CHOICE (a file: tests, or a fresh choice without rebuilding the kernels), else
    $BYZANTIUM_CACHE/linear_choice.json."""
    env = os.environ.get("BYZANTIUM_KERNEL_CHOICE")
    return Path(env).expanduser() if env else cache_root() / "linear_choice.json"


@contextlib.contextmanager
def locked_cache():
    """The per-machine kernel choices (these linears', kernels/cpu.py's attention paths), read and written
    under an exclusive lock: processes that start together (Ray replicas) measure once and agree."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text()) if path.exists() else {}
        except (json.JSONDecodeError, OSError):
            data = {}  # a damaged cache is measured again
        before = json.dumps(data, sort_keys=True)
        yield data
        if json.dumps(data, sort_keys=True) != before:
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(path)


def remeasure() -> bool:
    """$BYZANTIUM_LINEAR_KERNELS=measure: time again what the cache holds (after a choice made on a busy machine)."""
    return os.environ.get("BYZANTIUM_LINEAR_KERNELS", "").strip() == "measure"


def forced_choice(available):
    """$BYZANTIUM_LINEAR_KERNELS=panels|panels512|panels_bf16|onednn|torch forces one kernel for every shape and phase (benchmarks,
    debugging); unset or "auto": the cached choice, measured once per machine; "measure": measured again."""
    forced = os.environ.get("BYZANTIUM_LINEAR_KERNELS", "auto").strip() or "auto"
    if forced in ("auto", "measure"):
        return None
    names = [c.name for c in available]
    if forced not in names:
        raise ValueError(f"BYZANTIUM_LINEAR_KERNELS={forced!r}: not available here (available: {', '.join(names)}, auto)")
    return forced


def choose(weights_by_shape, available):
    """{(in, out): candidate name} for every shape, measured here or read from the cache; and
    {shape: {candidate: {"decode" or "prefill": seconds}}} of what was measured now (empty when all came
    from the cache). One kernel for both kinds of rows: a token's K/V must not depend on whether a decode
    or a prefill pass computed it (sessions, prefix-cache hits and replays reuse them across phases)."""
    if not available:
        return {}, {}
    forced = forced_choice(available)
    if forced is not None or len(available) == 1:
        name = forced or available[0].name
        return dict.fromkeys(weights_by_shape, name), {}
    choices, measured = {}, {}
    generator = torch.Generator().manual_seed(0)
    with locked_cache() as cache, torch.inference_mode():
        machine = cache.setdefault(machine_key(), {})
        for (k, n), weights in weights_by_shape.items():
            dtype = str(weights[0].dtype).removeprefix("torch.")
            key = f"{k}x{n} {dtype} {'+'.join(c.name for c in available)} one-kernel"
            entry = machine.get(key)
            if remeasure() and key not in _remeasured:
                entry = None
                _remeasured.add(key)
            if entry is None:
                invariant = [c for c in available if batch_invariant(c, weights[0], generator)] or available[:1]
                for _ in range(TRIES):
                    timings, busy = time_shape(invariant, weights, k, generator)
                    if not busy:
                        break
                best = min(timings, key=lambda c: timings[c]["decode"] + timings[c]["prefill"])
                entry = {"kernel": best, "seconds": timings}
                measured[(k, n)] = timings
                if busy:  # noisy timings choose nothing; the fixed fallback is kept, so that later starts agree
                    entry = {"kernel": invariant[0].name, "seconds": timings, "busy": True}
                    warn_once(f"byzantium: the machine was busy while timing the CPU linear kernels; {invariant[0].name} "
                              f"is chosen and kept for this machine (rerun once with BYZANTIUM_LINEAR_KERNELS=measure "
                              f"on a quiet machine to time them again)")
                machine[key] = entry
            choices[(k, n)] = entry.get("kernel") or entry["decode"]  # "decode": the older entries' name for it
    return choices, measured


__all__ = ["BATCH_HINT", "Candidate", "OneDNN", "Panels", "Panels512", "PanelsBF16", "Torch", "batch_invariant", "candidates", "choose",
           "cache_path", "cpu_name", "locked_cache", "machine_key", "remeasure"]
