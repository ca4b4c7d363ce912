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
    token = ext.race_sample(logits, stream_lo, stream_hi)  # cpu_sampling.cpp (engine/sampling.py)

Each kernel is written once, as a template over the SIMD traits of cpu_simd.h (vector width, loads and
stores of fp32 and bf16, FMA, reductions, bf16 dot products), in a header (cpu_gemm.h, cpu_decode.h,
cpu_prefill.h, cpu_layer_ops.h), and instantiated per instruction set: cpu_avx2.cpp with the build's flags
(-mavx2 -mfma), cpu_avx512.cpp and cpu_avx512_bf16.cpp inside their target pragmas, so that no other code
uses AVX-512 and the library loads on an AVX2-only CPU. The torch side (checks, outputs, threads, and which
instruction set runs, from the CPU's features) is cpu_gemm.cpp, cpu_attention.cpp and cpu_layer_ops.cpp;
cpu_kernels.h declares what each instruction set's unit provides.

The build (1-2 minutes on 2 cores; `make demo` and `make test` run it at installation through
`build_now()`) goes to `$BYZANTIUM_CACHE/ext/cpu-<sources>-<environment>` (default
~/.cache/byzantium/ext): one directory per kernel sources, torch version and Python environment, since two
environments compile with different include paths. Later processes load the built library in well under
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

SOURCES = [Path(__file__).with_name(name) for name in
           ("cpu_ext.cpp", "cpu_gemm.cpp", "cpu_attention.cpp", "cpu_layer_ops.cpp", "cpu_sampling.cpp",
            "cpu_avx2.cpp", "cpu_avx512.cpp", "cpu_avx512_bf16.cpp")]
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


BUILD_WAIT_S = 900.0  # the most a process waits for another one's build before going on without it
_waited = [0.0]  # seconds this process has spent waiting for another process's build


def waited_seconds() -> float:
    """Seconds this process has waited for another process's build: a run's wall time leaves them out."""
    return _waited[0]


@functools.cache
def source_digest():
    """What names a build: the kernels' sources and the torch version (a changed kernel is timed again too)."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS) + torch.__version__.encode()).hexdigest()[:12]


def environment_digest():
    """Which Python environment builds: its prefix and the torch it compiles against (include paths)."""
    return hashlib.sha256(f"{sys.prefix}|{torch.__file__}".encode()).hexdigest()[:8]


def build_directory():
    return cache_root() / "ext" / f"cpu-{source_digest()}-{environment_digest()}"


@functools.cache
def load():
    reason = unsupported_reason()
    if reason is not None:
        warn_once(f"byzantium: the compiled CPU kernels are not used ({reason}); the linears use oneDNN "
                  f"and attention the torch reference")
        return None
    build_dir = build_directory()
    build_dir.mkdir(parents=True, exist_ok=True)

    def build():
        if not any(build_dir.glob("*.so")):
            print("byzantium: building the CPU kernels (once per machine and environment, about a minute)",
                  file=sys.stderr, flush=True)
        from torch.utils.cpp_extension import load as torch_load
        return torch_load(name=f"byzantium_cpu_{source_digest()}", sources=[str(p) for p in SOURCES],
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
