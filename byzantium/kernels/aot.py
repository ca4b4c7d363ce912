"""Compile the engine's Triton kernels for a GPU that is not there, through their real launch wrappers.

    with offline_target(90) as compiled:          # sm_90 (Hopper); 80 for Ampere
        triton_ops.paged_decode_attention(...)    # CPU tensors: nothing runs, each launch compiles
    for c in compiled: usage(c)                   # shared memory, registers and spills of each

Inside the block Triton's active driver reports the target GPU and every kernel launch compiles
(the whole pipeline to a cubin, with the ptxas that ships in the triton wheel) and returns without
running: the signature, constexprs, specialisation and num_warps are exactly what the wrapper passes.
`usage` asks ptxas for registers and spills. `specializations` lists the launches the engine makes, per
kernel x dtype x head-dim family and tile choice, FP8 KV and FP8 experts, odd GQA groups and head dims
(padded to tl.dot's 16), windows and chunks; tests/test_triton_aot.py compiles a set of
them in `make test`, bench/triton_aot.py the whole matrix.
"""
import contextlib
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch

SHARED_LIMIT = {90: 232448, 89: 101376, 80: 166912}  # bytes a block may opt in to (227 / 99 / 163 KiB)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Compiled:
    name: str  # the kernel's function name
    kernel: object  # triton's CompiledKernel
    arch: int


class _OfflineDriver:
    """What JITFunction.run asks the active driver: a device, a stream and the target."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")


@contextlib.contextmanager
def offline_target(arch=90, warp_size=32):
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    compiled, touched, real_run = [], set(), JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        if self not in touched:  # its cached binder and kernels belong to the real device
            self.device_caches.clear()
            touched.add(self)
        kernel = real_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(Compiled(self.__name__, kernel, arch))
        return kernel

    previous = driver._active  # None until a real driver was made; reset_active() would make one
    driver.set_active(_OfflineDriver(GPUTarget("cuda", arch, warp_size)))
    JITFunction.run = compile_only
    try:
        yield compiled
    finally:
        JITFunction.run = real_run
        driver._active = previous
        for fn in touched:
            fn.device_caches.clear()


def usage(compiled):
    """{"shared", "registers", "spill_stores", "spill_loads", "num_warps"} of one compiled kernel."""
    from triton.backends.nvidia.compiler import get_ptxas
    arch = f"sm_{compiled.arch}a" if compiled.arch == 90 else f"sm_{compiled.arch}"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.kernel.asm["ptx"])
        ptx.flush()
        log = subprocess.run([get_ptxas(compiled.arch).path, "-v", f"--gpu-name={arch}", ptx.name, "-o", "/dev/null"],
                             capture_output=True, text=True, check=True).stderr
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {"shared": compiled.kernel.metadata.shared, "registers": int(registers.group(1)) if registers else None,
            "spill_stores": int(spills.group(1)) if spills else 0, "spill_loads": int(spills.group(2)) if spills else 0,
            "num_warps": compiled.kernel.metadata.num_warps}


# ------------------------------------------------------------------------------ the engine's launches

def _cache(dtype, head_dim, num_kv_heads=2, blocks=64, block_size=16):
    k = torch.zeros(blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    return k, torch.zeros_like(k)


def store(dtype, head_dim, cache_dtype=None):
    from . import triton_ops
    k_cache, v_cache = _cache(cache_dtype or dtype, head_dim)
    k = torch.zeros(8, 2, head_dim, dtype=dtype)
    triton_ops.store_kv(k, k.clone(), k_cache, v_cache, torch.arange(8))


def decode(dtype, head_dim, num_splits=1, group=4, cache_dtype=None, window=None, chunk=None):
    """cache_dtype: an FP8 pool under `dtype` queries; window and chunk are runtime arguments (one kernel)."""
    from . import triton_ops
    k_cache, v_cache = _cache(cache_dtype or dtype, head_dim)
    q = torch.zeros(4, 2 * group, head_dim, dtype=dtype)
    seq_lens, tables = torch.tensor([5, 17, 300, 2], dtype=torch.int32), torch.zeros(4, 32, dtype=torch.int32)
    triton_ops.paged_decode_attention(q, k_cache, v_cache, seq_lens, tables, 0.1, window, chunk, num_splits=num_splits)


def prefill(dtype, head_dim, tokens_per_seq, group=4, cache_dtype=None, window=None, chunk=None):
    """The tile the wrapper chooses for sequences of `tokens_per_seq` new tokens each."""
    from . import triton_ops
    k_cache, v_cache = _cache(cache_dtype or dtype, head_dim)
    num_seqs = 2
    q = torch.zeros(num_seqs * tokens_per_seq, 2 * group, head_dim, dtype=dtype)
    cu = torch.arange(num_seqs + 1, dtype=torch.int32) * tokens_per_seq
    seq_lens, tables = torch.full((num_seqs,), tokens_per_seq + 16, dtype=torch.int32), torch.zeros(num_seqs, 64, dtype=torch.int32)
    triton_ops.append_prefill_attention(q, k_cache, v_cache, cu, seq_lens, tables, 0.1, window, chunk=chunk)


def moe(dtype, tokens, fp8_experts=False):
    """Both grouped GEMMs at the tile the wrapper chooses for `tokens` tokens (decode- or prefill-sized);
    fp8_experts: e4m3 expert weights with per-channel scales under `dtype` activations."""
    from .triton_moe import fused_moe_triton
    experts, hidden, inter, top_k = 8, 256, 128, 2
    weight_dtype = FP8 if fp8_experts else dtype
    x = torch.zeros(tokens, hidden, dtype=dtype)
    w13 = torch.zeros(experts, 2 * inter, hidden, dtype=weight_dtype)
    w2 = torch.zeros(experts, hidden, inter, dtype=weight_dtype)
    ids = torch.arange(tokens * top_k).remainder(experts).view(tokens, top_k)
    scales = dict(w13_scale=torch.ones(experts, 2 * inter), w2_scale=torch.ones(experts, hidden)) if fp8_experts else {}
    fused_moe_triton(x, w13, w2, torch.ones(tokens, top_k, dtype=dtype), ids, **scales)


FP8 = torch.float8_e4m3fn
HEAD_DIMS = (64, 128, 256)
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}  # the dtypes FP8 KV and FP8 experts run under
ODD_SHAPES = ((8, 1), (80, 3), (96, 5), (112, 6))  # (head dim, GQA group): padded head dims, odd groups


def specializations(full=False, arch=90):
    """(label, launch) pairs for compute capability `arch`: with full=False one per kernel x dtype x
    head-dim family, plus the FP8 (sm_89 and later), odd-shape and window/chunk launches most likely to
    spill (the test's set), else every tile choice the wrappers make too (the bench's matrix)."""
    out = []
    for dname, dtype in DTYPES.items():
        for hd in HEAD_DIMS:
            out.append((f"store_kv {dname} d{hd}", lambda d=dtype, h=hd: store(d, h)))
            for splits in ((1, 8) if full else (8,)):  # 8 splits: the split kernel and the merge
                out.append((f"decode {dname} d{hd} splits{splits}", lambda d=dtype, h=hd, s=splits: decode(d, h, s)))
            for tokens in ((1, 8, 64, 512) if full else (512,)):
                out.append((f"prefill {dname} d{hd} {tokens}/seq", lambda d=dtype, h=hd, t=tokens: prefill(d, h, t)))
        for tokens in ((4, 512) if full else (512,)):
            out.append((f"moe {dname} {tokens} tokens", lambda d=dtype, t=tokens: moe(d, t)))
    if arch >= 89:  # e4m3 needs sm_89: an FP8 KV pool and FP8 experts under half-precision activations
        for dname, dtype in (HALF.items() if full else [("bf16", torch.bfloat16)]):
            for hd in (HEAD_DIMS if full else (128, 256)):
                out.append((f"store_kv fp8-kv {dname} d{hd}", lambda d=dtype, h=hd: store(d, h, FP8)))
                for splits in (1, 8):
                    out.append((f"decode fp8-kv {dname} d{hd} splits{splits}",
                                lambda d=dtype, h=hd, s=splits: decode(d, h, s, cache_dtype=FP8)))
                for tokens in ((1, 64, 512) if full else (512,)):
                    out.append((f"prefill fp8-kv {dname} d{hd} {tokens}/seq",
                                lambda d=dtype, h=hd, t=tokens: prefill(d, h, t, cache_dtype=FP8)))
            for tokens in (4, 512):
                out.append((f"moe fp8-experts {dname} {tokens} tokens", lambda d=dtype, t=tokens: moe(d, t, True)))
    for hd, group in (ODD_SHAPES if full else ODD_SHAPES[:2]):
        for dname, dtype in (DTYPES.items() if full else [("bf16", torch.bfloat16)]):
            out.append((f"decode {dname} d{hd} g{group} splits8", lambda d=dtype, h=hd, g=group: decode(d, h, 8, g)))
            out.append((f"prefill {dname} d{hd} g{group} 64/seq", lambda d=dtype, h=hd, g=group: prefill(d, h, 64, g)))
    for kind in ("window", "chunk"):  # runtime arguments: the same kernels as above, launched as the layers do
        limit = {kind: 128}
        out.append((f"decode bf16 d128 {kind}128 splits8", lambda a=limit: decode(torch.bfloat16, 128, 8, **a)))
        out.append((f"prefill bf16 d128 {kind}128 512/seq", lambda a=limit: prefill(torch.bfloat16, 128, 512, **a)))
    return out
