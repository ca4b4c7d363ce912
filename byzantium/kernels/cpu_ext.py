"""Byzantium's CPU kernels (fp32, AVX2): compiled once per machine and torch version, then cached.

    ext = load()            # None when it cannot be had: no AVX2, no C++ compiler, a failed build
    y = ext.small_linear(x, weight, bias)   # cpu_gemv.cpp: x [M, K]; the engine calls it for M <= MAX_ROWS

The build (~30-60 s on 2 cores) goes to `$BYZANTIUM_CACHE/ext` (default ~/.cache/byzantium/ext); later
processes load the built library in well under a second. Callers fall back to oneDNN when it is None.
"""
import functools
import hashlib
import shutil
import sys
import warnings
from pathlib import Path

import torch

SOURCES = [Path(__file__).with_name(name) for name in ("cpu_ext.cpp", "cpu_gemv.cpp", "cpu_attention.cpp")]
MAX_ROWS = 8  # measured crossover: above ~8 rows oneDNN's blocked GEMM is faster than one pass per weight row


def supported() -> bool:
    """AVX2 (with FMA, which every AVX2 x86 CPU has) on Linux, and a C++ compiler and ninja to build with."""
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()
    return (sys.platform.startswith("linux") and capability in ("AVX2", "AVX512")
            and shutil.which("c++") is not None and shutil.which("ninja") is not None and all(path.exists() for path in SOURCES))


@functools.cache
def load():
    if not supported():
        return None
    from ..engine.loader import cache_root
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES) + torch.__version__.encode()).hexdigest()[:12]
    build_dir = cache_root() / "ext" / f"cpu-{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    if not any(build_dir.glob("*.so")):
        print("byzantium: building the CPU kernels (once per machine, about a minute)",
              file=sys.stderr, flush=True)
    try:
        from torch.utils.cpp_extension import load as build
        return build(name=f"byzantium_cpu_{digest}", sources=[str(p) for p in SOURCES], build_directory=str(build_dir),
                     extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], verbose=False)
    except Exception as error:  # noqa: BLE001 - any build failure means: use oneDNN instead
        warnings.warn(f"byzantium: the CPU kernels could not be built ({type(error).__name__}: "
                      f"{str(error)[:200]}); using oneDNN for every batch size", RuntimeWarning, stacklevel=2)
        return None
