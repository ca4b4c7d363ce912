"""Every Triton kernel the engine launches compiles for Hopper (sm_90), Ada (sm_89, FP8's first) and Ampere
(sm_80), through the real launch wrappers, with no GPU here: within the shared-memory limit, and no
register spills, under the installed Triton (CI's) and, in `make test-device-versions`, Triton 3.6 (the
GPU machine's).
The CPU tests run these kernels under the interpreter, which enforces none of this (tl.dot shapes,
block sizes, dtype rules, shared memory, registers). One specialisation per kernel x dtype x head-dim
family; bench/triton_aot.py compiles every tile choice and records the table."""
import importlib.util
import os
import warnings

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs triton, compiling (not interpreting)")


def _ptxas_or_skip():
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        assert os.path.exists(get_ptxas(90).path)
    except Exception as e:  # noqa: BLE001 - a triton wheel without the NVIDIA tools
        pytest.skip(f"no ptxas in this triton: {e}")


@pytest.mark.parametrize("arch", [90, 89, 80])
def test_every_kernel_compiles_within_limits_and_without_spills(arch):
    _ptxas_or_skip()
    from byzantium.kernels import aot
    problems, seen = [], set()
    for label, launch in aot.specializations(full=False, arch=arch):
        with warnings.catch_warnings(), aot.offline_target(arch) as compiled:
            warnings.simplefilter("ignore")
            launch()
        assert compiled, f"{label}: no kernel was launched"
        for c in compiled:
            seen.add(c.name)
            use = aot.usage(c)
            if use["shared"] > aot.SHARED_LIMIT[arch]:
                problems.append(f"{label} {c.name}: {use['shared']} bytes of shared memory")
            if use["spill_stores"] or use["spill_loads"]:
                problems.append(f"{label} {c.name}: spills {use['spill_stores']}/{use['spill_loads']} bytes")
    assert not problems, "\n".join(problems)
    assert seen == {"_store_kv_kernel", "_decode_split_kernel", "_decode_merge_kernel", "_append_prefill_kernel",
                    "_w13_kernel", "_w2_kernel"}


def test_offline_compilation_leaves_the_driver_as_it_was():
    _ptxas_or_skip()
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from byzantium.kernels import aot, triton_ops
    before, run = driver._active, JITFunction.run
    with warnings.catch_warnings(), aot.offline_target(90):
        warnings.simplefilter("ignore")
        aot.store(aot.DTYPES["fp16"], 64)
    assert driver._active is before and JITFunction.run is run
    assert not triton_ops._store_kv_kernel.device_caches  # no sm_90 binder left for a real device 0
