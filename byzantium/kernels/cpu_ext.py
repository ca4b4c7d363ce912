"""Byzantium's CPU kernels (fp32 on AVX2 and AVX-512, bf16 on avx512_bf16): compiled once per machine and
torch version, then cached.

    ext = load()            # None when it cannot be had: no AVX2, no C++ compiler, a failed build
    panels = ext.pack_panels(weight)                  # cpu_gemm.h: the linears (engine/layers/linear.py)
    y = ext.panel_linear(x, panels, bias, weight.shape[0])
    a = ext.panel_glu(x, ext.pack_glu(gate_up_weight), None, I)        # silu(gate) * up, fused
    if ext.avx512_supported():                        # the same with AVX-512
        y = ext.panel_linear512(x, ext.pack_panels512(weight), bias, weight.shape[0])
        a = ext.panel_glu512(x, ext.pack_glu512(gate_up_weight), None, I)  # silu(gate) * up, fused
    if ext.avx512_bf16_supported():                   # bf16 models on the bf16 units
        y = ext.panel_linear_bf16(x_bf16, ext.pack_panels_bf16(weight_bf16), bias_fp32, weight.shape[0])
        h = ext.rms_norm_bf16(x_bf16, weight_bf16, eps)  # cpu_layer_ops.h: bf16 norms and rope
    out = ext.paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale)  # cpu_decode.h, at
                                                      # AVX-512 width where the CPU has it (avx512=False: AVX2)
    if ext.prefill_supported(head_dim):               # cpu_prefill.h (AVX-512)
        out = ext.paged_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale)
    h = ext.rms_norm(x, weight, eps); a = ext.silu_mul(gate_up); q = ext.rope(q, cos, signed_sin)  # cpu_layer_ops.h
    token = ext.race_sample(logits, stream_lo, stream_hi)  # cpu_sampling.cpp (engine/sampling/cpu.py)

Each kernel is written once, as a template over the SIMD traits of cpu_simd.h (vector width, loads and
stores of fp32 and bf16, FMA, reductions, bf16 dot products), in a header (cpu_gemm.h, cpu_decode.h,
cpu_prefill.h, cpu_layer_ops.h), and instantiated per instruction set: cpu_avx2.cpp with the build's flags
(-mavx2 -mfma), cpu_avx512.cpp and cpu_avx512_bf16.cpp inside their target pragmas, so that no other code
uses AVX-512 and the library loads on an AVX2-only CPU. The torch side (checks, outputs, threads, and which
instruction set runs, from the CPU's features) is cpu_gemm.cpp, cpu_attention.cpp and cpu_layer_ops.cpp;
cpu_kernels.h declares what each instruction set's unit provides.

The build compiles only the units this CPU can run (chosen_sources, from /proc/cpuinfo's flags; a stand-in
for each other one) and says what it builds and roughly how long before it starts (build_estimate: a
build takes minutes, so it should not surprise a first start; `make demo` and `make test` run it at
installation through `build_now()`; timings: bench/results/cpu_kernel_build.md). It goes to
`$BYZANTIUM_CACHE/ext/cpu-<sources>-<environment>[-<units>]` (default ~/.cache/byzantium/ext): one directory
per kernel sources built, torch version and Python environment, since two environments compile with
different include paths; a build that leaves units out names the ones it has. Later processes load the built library in well under
a second. One process builds at a time, under a lock the kernel drops when that process dies (an
interrupted build never blocks the next start); a process that waits longer than BUILD_WAIT_S for another
one's build says so and goes on without the kernels. When load() is None the engine uses oneDNN for the
linears and the torch reference for attention.
"""
import fcntl
import functools
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from ..paths import cache_root
from .notices import warn_once

COMMON = ("cpu_ext.cpp", "cpu_gemm.cpp", "cpu_attention.cpp", "cpu_layer_ops.cpp", "cpu_sampling.cpp", "cpu_avx2.cpp")
# Each instruction-set unit beyond AVX2: (its name, the /proc/cpuinfo flags it needs, its source, the
# stand-in built where the CPU lacks them, whose kernels throw and are never reached: the callers check the
# CPU first).
OPTIONAL_UNITS = (("avx512", ("avx512f",), "cpu_avx512.cpp", "cpu_avx512_absent.cpp"),
                  ("avx512_bf16", ("avx512f", "avx512_bf16"), "cpu_avx512_bf16.cpp", "cpu_avx512_bf16_absent.cpp"))
# Rough compile seconds of each source on one idle core, for the line said before a build
# (bench/results/cpu_kernels.md); the torch side (the default) is the heavy part: torch's headers.
COMPILE_SECONDS = {"cpu_avx512.cpp": 18, "cpu_avx512_bf16.cpp": 4, "cpu_avx2.cpp": 5,
                   "cpu_avx512_absent.cpp": 1, "cpu_avx512_bf16_absent.cpp": 1}
COMPILE_SECONDS_DEFAULT = 30
SOURCES = [Path(__file__).with_name(name) for name in
           COMMON + tuple(name for _, _, unit, absent in OPTIONAL_UNITS for name in (unit, absent))]
HEADERS = [Path(__file__).with_name(name) for name in
           ("cpu_simd.h", "cpu_math.h", "cpu_kernels.h", "cpu_gemm.h", "cpu_decode.h", "cpu_prefill.h", "cpu_layer_ops.h",
            "cpu_panel_schedule.h")]


def supported() -> bool:
    """AVX2 (with FMA, which every AVX2 x86 CPU has) on Linux, and a C++ compiler and ninja to build with."""
    return unsupported_reason() is None


def unsupported_reason():
    """Why the kernels cannot be built here, or None."""
    if os.environ.get("BYZANTIUM_CPU_KERNELS", "").lower() in ("0", "off", "false", "no"):
        return "BYZANTIUM_CPU_KERNELS turns them off (as the GPU check does: it builds nothing)"
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()
    if not sys.platform.startswith("linux"):
        return f"they are built on Linux only, this is {sys.platform}"
    if capability not in ("AVX2", "AVX512"):
        return f"the CPU has no AVX2 (torch reports {capability or 'nothing'})"
    if shutil.which("c++") is None:
        return "no C++ compiler (c++) on PATH"
    if not _find_ninja():
        return "ninja is not installed"
    if not all(path.exists() for path in SOURCES + HEADERS):
        return "their sources are missing from the installation"
    return None


def _find_ninja() -> bool:
    """ninja on PATH, or the one the `ninja` dependency installed (in the virtual environment's bin, which
    is not on PATH when .venv/bin/python runs without the environment activated): put it on PATH."""
    if shutil.which("ninja"):
        return True
    try:
        import ninja
    except ImportError:
        return False
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    return shutil.which("ninja") is not None


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The CPU's feature flags as Linux names them (the flags __builtin_cpu_supports reads, which the
    kernels check before they call an AVX-512 unit), or None when they cannot be read."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return None


def chosen_sources(flags):
    """The sources built for a CPU with these flags: every unit it can run, and a stand-in for each it
    cannot (so that no AVX-512 code is compiled for an AVX2-only CPU). Unknown flags (None): every unit."""
    names = list(COMMON)
    for _, needs, unit, absent in OPTIONAL_UNITS:
        names.append(unit if flags is None or all(flag in flags for flag in needs) else absent)
    return [Path(__file__).with_name(name) for name in names]


def instruction_sets(sources):
    """What a build of these sources runs: "avx2", "avx2-avx512" or "avx2-avx512-avx512_bf16"."""
    names = {p.name for p in sources}
    return "-".join(["avx2"] + [name for name, _, unit, _ in OPTIONAL_UNITS if unit in names])


def build_estimate(sources, jobs=None):
    """Rough wall seconds of a build of these sources with `jobs` compilers at once (the CPU's cores)."""
    jobs = max(1, jobs or int(os.environ.get("MAX_JOBS") or 0) or os.cpu_count() or 1)
    seconds = sorted((COMPILE_SECONDS.get(p.name, COMPILE_SECONDS_DEFAULT) for p in sources), reverse=True)
    return max(seconds[0], sum(seconds) / jobs)


def build_plan(flags):
    """(sources, a line saying what is built and roughly how long) for a CPU with these flags."""
    sources = chosen_sources(flags)
    left_out = [unit for _, _, unit, _ in OPTIONAL_UNITS if Path(__file__).with_name(unit) not in sources]
    why = f"; left out, as this CPU cannot run them: {', '.join(left_out)}" if left_out else ""
    minutes = max(1, round(build_estimate(sources) / 60))
    line = (f"byzantium: building the CPU kernels for {instruction_sets(sources).replace('-', ' + ')} "
            f"({len(sources)} sources{why}); once per machine and environment, about {minutes} "
            f"minute{'s' if minutes > 1 else ''} on {os.cpu_count()} idle cores, several times that on a busy machine")
    return sources, line


BUILD_WAIT_S = 900.0  # the most a process waits for another one's build before going on without it
_waited = [0.0]  # seconds this process has spent waiting for another process's build


def waited_seconds() -> float:
    """Seconds this process has waited for another process's build: a run's wall time leaves them out."""
    return _waited[0]


@functools.cache
def source_digest(flags=None):
    """What names a build: the sources built for this CPU (flags: its cpu_flags()), the headers and the torch
    version (a changed kernel is timed again too)."""
    sources = chosen_sources(cpu_flags() if flags is None else flags)
    return hashlib.sha256(b"".join(p.read_bytes() for p in sources + HEADERS) + torch.__version__.encode()).hexdigest()[:12]


def environment_digest():
    """Which Python environment builds: its prefix and the torch it compiles against (include paths)."""
    return hashlib.sha256(f"{sys.prefix}|{torch.__file__}".encode()).hexdigest()[:8]


def build_directory(flags=None):
    """Where the build for this CPU goes. A build that leaves units out has its own (named by what it
    runs), so that a cache shared with another CPU never hands it a library it cannot use."""
    flags = cpu_flags() if flags is None else flags
    sources = chosen_sources(flags)
    every_unit = all(Path(__file__).with_name(unit) in sources for _, _, unit, _ in OPTIONAL_UNITS)
    tail = "" if every_unit else f"-{instruction_sets(sources)}"
    return cache_root() / "ext" / f"cpu-{source_digest(flags)}-{environment_digest()}{tail}"


@functools.cache
def load():
    reason = unsupported_reason()
    if reason is not None:
        warn_once(f"byzantium: the compiled CPU kernels are not used ({reason}); the linears use oneDNN "
                  f"and attention the torch reference")
        return None
    flags = cpu_flags()
    sources, plan = build_plan(flags)
    build_dir = build_directory(flags)
    build_dir.mkdir(parents=True, exist_ok=True)

    def build():
        if not any(build_dir.glob("*.so")):
            print(plan, file=sys.stderr, flush=True)
        from torch.utils.cpp_extension import load as torch_load
        name = f"byzantium_cpu_{source_digest(flags)}"
        return torch_load(name=name, sources=[str(p) for p in sources],
                          build_directory=str(build_dir), extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
                          verbose=False)
    try:
        return locked_build(build_dir, build)
    except Exception as error:  # noqa: BLE001 - any build failure means: use the fallbacks
        warn_once(f"byzantium: the CPU kernels could not be built ({type(error).__name__}: {str(error)[:200]}); "
                  f"the linears use oneDNN and attention the torch reference")
        return None


def locked_build(build_dir, build, wait_s=None):
    """build() while holding build_dir's lock: an flock, which the kernel drops when its holder dies, so
    a killed build leaves nothing that blocks. torch's own lock file there ("lock", which its loader
    waits on forever) can then only be a killed build's leftover: it is removed first. Waiting for
    another process's build raises TimeoutError after wait_s (BUILD_WAIT_S); Ctrl-C ends the wait."""
    wait_s = BUILD_WAIT_S if wait_s is None else wait_s
    with open(build_dir / "byzantium.lock", "a") as lock:
        began = time.monotonic()
        deadline, told = began + wait_s, False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _waited[0] += time.monotonic() - began
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has been building the CPU kernels in {build_dir} "
                                       f"for over {wait_s:.0f} s") from None
                if not told:
                    print(f"byzantium: waiting for another process that is building the CPU kernels ({build_dir})",
                          file=sys.stderr, flush=True)
                    told = True
                time.sleep(0.2)
        try:
            (build_dir / "lock").unlink(missing_ok=True)
            return build()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_now():
    """Build (or find built) the kernels and say what came of it: the installation step of the Makefile."""
    print(f"byzantium: CPU kernels {'ready' if load() is not None else 'not used (see above)'}", file=sys.stderr)
