"""Sliding-window attention (`window=W`: the query at position p sees keys (p - W, p]) in every backend,
and the Triton kernels' chunked attention (`chunk=C`: keys [p // C * C, p]).

- The torch reference against a naive dense float64 computation with an explicit window mask.
- The compiled CPU kernels (decode at both widths, the prefill tiles, fp32 and bf16, and the backend's
  split of an append into row-by-row queries and tiles) against the reference, windows and chunks alike.
- The Triton kernels against the reference: under the interpreter in a fresh TRITON_INTERPRET=1 process
  (as tests/test_kernels.py does), on CUDA in this process.
- flash-attn's window_size argument.

Windows shorter than a kernel tile (rows that see no key of a whole tile), windows of 1, windows longer
than every sequence (no effect), and batches mixing fresh prompts, long cached prefixes and decode rows.
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from byzantium.engine.attention_backend import ModelFeatures, choose_attention_backend
from byzantium.kernels import cpu, cpu_ext, reference
from test_kernels import HAS_CUDA, HAS_TRITON, TRITON_DEVICE, assert_matches, make_batch

# (prefix already cached, new tokens): fresh prompts longer than the windows, extends of long prefixes,
# decode rows far past the window and inside it.
BATCH = [(0, 37), (70, 19), (23, 1), (100, 1), (16, 16), (0, 1), (5, 3)]
DECODE = [(n - 1, 1) for n in (1, 7, 20, 77, 150, 33)]
WINDOWS = [1, 8, 20, 64, 1000]


def naive_window_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, window):
    """Dense float64, one sequence and query head at a time, K/V read token by token, explicit mask."""
    num_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b, total in enumerate(seq_lens.tolist()):
        start, end = cu_seqlens_q[b].item(), cu_seqlens_q[b + 1].item()
        slots = [(block_tables[b, p // block_size].item(), p % block_size) for p in range(total)]
        if not slots:
            continue
        group = num_heads // num_kv_heads
        k = torch.stack([k_cache[blk, off] for blk, off in slots]).double().repeat_interleave(group, 1)  # [L, Hq, D]
        v = torch.stack([v_cache[blk, off] for blk, off in slots]).double().repeat_interleave(group, 1)
        for j in range(end - start):
            position = total - (end - start) + j
            visible = torch.tensor([position - window < key <= position for key in range(total)])
            for h in range(num_heads):
                scores = (k[:, h] @ q[start + j, h].double()) * scale
                scores[~visible] = float("-inf")
                out[start + j, h] = torch.softmax(scores, 0) @ v[:, h]
    return out


def decode_args(data):
    return [data[k] for k in ("q", "k_cache", "v_cache", "seq_lens", "block_tables")]


@pytest.mark.parametrize("window", WINDOWS)
def test_reference_prefill_window_matches_naive(window):
    data = make_batch(BATCH, 4, 2, 32, 16, torch.float32, "cpu", seed=window)
    out = reference.append_prefill_attention(**data, scale=0.2, window=window)
    assert_matches(out, naive_window_attention(**data, scale=0.2, window=window), torch.float32)


@pytest.mark.parametrize("window", WINDOWS)
def test_reference_decode_window_matches_naive(window):
    data = make_batch(DECODE, 4, 2, 32, 16, torch.float32, "cpu", seed=window)
    out = reference.paged_decode_attention(*decode_args(data), 0.2, window=window)
    assert_matches(out, naive_window_attention(**data, scale=0.2, window=window), torch.float32)


def test_reference_window_longer_than_every_sequence_is_global():
    data = make_batch(BATCH, 4, 2, 32, 16, torch.float32, "cpu")
    torch.testing.assert_close(reference.append_prefill_attention(**data, scale=0.2, window=101),
                               reference.append_prefill_attention(**data, scale=0.2), rtol=0, atol=0)


# ------------------------------------------------------------------------- compiled CPU kernels vs reference

CPU_EXT = cpu_ext.load()
needs_cpu_kernels = pytest.mark.skipif(CPU_EXT is None, reason="the compiled CPU kernels are not available here")
# (window, chunk): windows of 1 and shorter than a 48-row prefill tile, longer than a 64-key chunk of the
# tile's loop; chunks not aligned with the 16-slot blocks; both masks at once (the later start wins).
MASKS = [(1, None), (8, None), (20, None), (100, None), (None, 8), (None, 20), (None, 100), (13, 40)]
# (cached prefix, new tokens): prompts of several tiles, appends to long prefixes, decode-like rows.
CPU_BATCH = [(0, 130), (70, 19), (23, 1), (150, 60), (16, 16), (0, 1), (5, 3)]


def masks(window, chunk):
    return dict(window=window or 0, chunk=chunk or 0)


@needs_cpu_kernels
@pytest.mark.parametrize("window, chunk", MASKS)
@pytest.mark.parametrize("avx512", [True, False])  # AVX-512 width where the CPU has it; AVX2 width
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # the pool's
def test_cpu_decode_kernel_masks_match_reference(window, chunk, avx512, dtype):
    data = make_batch(DECODE + [(299, 1)], 8, 2, 64, 16, torch.float32, "cpu", seed=(window or 0) + (chunk or 0))
    q, k_cache, v_cache, lens, tables = decode_args(data)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    want = reference.paged_decode_attention(q, k_cache.float(), v_cache.float(), lens, tables, 0.125, window=window,
                                            chunk=chunk)
    got = CPU_EXT.paged_decode_attention(q, k_cache, v_cache, lens, tables, 0.125, avx512=avx512,
                                         **masks(window, chunk))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_cpu_kernels
@pytest.mark.skipif(CPU_EXT is None or not CPU_EXT.prefill_supported(64), reason="no AVX-512 on this CPU")
@pytest.mark.parametrize("window, chunk", MASKS)
@pytest.mark.parametrize("group", [1, 4])  # 4: a tile's 48 rows are 12 positions of 4 query heads
def test_cpu_prefill_kernel_masks_match_reference(window, chunk, group):
    data = make_batch(CPU_BATCH, 2 * group, 2, 64, 16, torch.float32, "cpu", seed=group + (window or chunk))
    want = reference.append_prefill_attention(**data, scale=0.125, window=window, chunk=chunk)
    meta = [data[k] for k in ("cu_seqlens_q", "seq_lens", "block_tables")]
    got = CPU_EXT.paged_prefill_attention(data["q"], data["k_cache"], data["v_cache"], *meta, 0.125,
                                          **masks(window, chunk))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # a bf16 pool, widened as it is read: fp32 attention over the same values
    k16, v16 = data["k_cache"].bfloat16(), data["v_cache"].bfloat16()
    want16 = reference.append_prefill_attention(**{**data, "k_cache": k16.float(), "v_cache": v16.float()},
                                                scale=0.125, window=window, chunk=chunk)
    got16 = CPU_EXT.paged_prefill_attention(data["q"], k16, v16, *meta, 0.125, **masks(window, chunk))
    torch.testing.assert_close(got16, want16, rtol=1e-5, atol=1e-5)
    if CPU_EXT.avx512_bf16_supported():  # bf16 queries: bf16 dot products, as the unmasked test bounds them
        out = CPU_EXT.paged_prefill_attention(data["q"].bfloat16(), k16, v16, *meta, 0.125, **masks(window, chunk))
        exact = reference.append_prefill_attention(**{**data, "q": data["q"].bfloat16().float(), "k_cache": k16.float(),
                                                       "v_cache": v16.float()}, scale=0.125, window=window, chunk=chunk)
        torch.testing.assert_close(out.float(), exact, rtol=8e-3, atol=1.2e-2)
        assert (out.float() - exact).abs().mean() < 1.5e-3


class WithoutTiles:
    """The compiled kernels as on a CPU without AVX-512: no prefill tiles (appends take gather + SDPA)."""

    def __init__(self, ext):
        self.ext = ext

    def __getattr__(self, name):
        return (lambda head_dim: False) if name == "prefill_supported" else getattr(self.ext, name)


@needs_cpu_kernels
@pytest.mark.parametrize("window, chunk", [(8, None), (None, 20), (13, 40)])
@pytest.mark.parametrize("limit", [0, 4, 128])  # every append on tiles; short ones row by row; all row by row
@pytest.mark.parametrize("tiles", [True, False])
def test_cpu_backend_append_masks_match_reference(window, chunk, limit, tiles, monkeypatch):
    """The backend's own split: appends of at most `limit` tokens as decode queries (each its own visible
    length, so its own first key), the rest on the tiles (or gather + SDPA without AVX-512)."""
    monkeypatch.setattr(cpu, "row_limit", lambda *shape: limit)
    if not tiles:
        monkeypatch.setattr(cpu_ext, "load", lambda: WithoutTiles(CPU_EXT))
    data = make_batch(CPU_BATCH, 8, 2, 64, 16, torch.float32, "cpu", seed=limit)
    want = reference.append_prefill_attention(**data, scale=0.125, window=window, chunk=chunk)
    got = cpu.append_prefill_attention(**data, scale=0.125, window=window, chunk=chunk)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    decode = make_batch(DECODE, 8, 2, 64, 16, torch.float32, "cpu", seed=limit + 1)
    torch.testing.assert_close(cpu.paged_decode_attention(*decode_args(decode), 0.125, window=window, chunk=chunk),
                               reference.paged_decode_attention(*decode_args(decode), 0.125, window=window,
                                                                chunk=chunk), rtol=1e-5, atol=1e-5)


@needs_cpu_kernels
def test_auto_chooses_the_cpu_kernels_for_window_and_chunk_layers():
    for features in (ModelFeatures(head_dim=16, window=True), ModelFeatures(head_dim=16, chunk=True),
                     ModelFeatures(head_dim=16, window=True, chunk=True)):
        assert choose_attention_backend("auto", "cpu", features=features).name == "cpu"
        assert choose_attention_backend("cpu", "cpu", features=features).reason == "requested"


# ------------------------------------------------------------------------------ Triton vs reference

@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.skipif(TRITON_DEVICE is not None, reason="the Triton kernels run in this process")
def test_triton_window_kernels_under_interpreter():
    """Run TestTritonWindow in a fresh process with TRITON_INTERPRET=1 set before triton is imported."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.path.join(root, "tests"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           f"{os.path.abspath(__file__)}::TestTritonWindow"]
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, \
        f"Triton window tests failed under the interpreter:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.skipif(TRITON_DEVICE is None, reason="no CUDA: run by test_triton_window_kernels_under_interpreter")
class TestTritonWindow:
    @pytest.fixture(scope="class")
    def ops(self):
        from byzantium.kernels import triton_ops
        return triton_ops

    @pytest.mark.parametrize("window", [1, 8, 20, 1000])
    @pytest.mark.parametrize("group", [1, 4])
    def test_append_prefill(self, ops, group, window):
        # block_m 16 and 64: with group 1 a tile holds 16 or 64 query tokens, more than windows 1 and 8,
        # so some rows see no key of a tile.
        data = make_batch(BATCH, 2 * group, 2, 64, 16, torch.float32, TRITON_DEVICE, seed=group + window)
        ref = reference.append_prefill_attention(**data, scale=0.125, window=window)
        for block_m in (16, 64):
            out = ops.append_prefill_attention(**data, scale=0.125, window=window, block_m=block_m)
            assert_matches(out, ref, torch.float32)

    @pytest.mark.parametrize("window", [1, 8, 20, 1000])
    @pytest.mark.parametrize("group", [1, 4])
    def test_decode(self, ops, group, window):
        data = make_batch(DECODE, 2 * group, 2, 64, 16, torch.float32, TRITON_DEVICE, seed=group + window)
        args = decode_args(data)
        ref = reference.paged_decode_attention(*args, 0.125, window=window)
        for num_splits in (1, 3):  # 3: the window's keys split, trailing splits empty for short windows
            assert_matches(ops.paged_decode_attention(*args, 0.125, window=window, num_splits=num_splits), ref,
                           torch.float32)


    @pytest.mark.parametrize("chunk", [8, 20])
    @pytest.mark.parametrize("group", [1, 4])
    def test_chunked_append_prefill_and_decode(self, ops, group, chunk):
        """Llama 4's chunked layers: the query at p sees [p // C * C, p] (the reference is checked against
        a naive computation in tests/test_llama4.py)."""
        data = make_batch(BATCH, 2 * group, 2, 64, 16, torch.float32, TRITON_DEVICE, seed=group + chunk)
        ref = reference.append_prefill_attention(**data, scale=0.125, chunk=chunk)
        for block_m in (16, 64):
            out = ops.append_prefill_attention(**data, scale=0.125, chunk=chunk, block_m=block_m)
            assert_matches(out, ref, torch.float32)
        args = decode_args(make_batch(DECODE, 2 * group, 2, 64, 16, torch.float32, TRITON_DEVICE, seed=chunk))
        ref = reference.paged_decode_attention(*args, 0.125, chunk=chunk)
        for num_splits in (1, 3):
            assert_matches(ops.paged_decode_attention(*args, 0.125, chunk=chunk, num_splits=num_splits), ref,
                           torch.float32)


# -------------------------------------------------------------------------------------- flash-attn

def test_flash_window_size():
    from byzantium.kernels import flash
    assert flash._window_size(None) == (-1, -1)
    assert flash._window_size(512) == (511, 0)  # keys p - 511 .. p: 512 of them, as (p - 512, p]


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None or not HAS_CUDA, reason="needs flash-attn and CUDA")
@pytest.mark.parametrize("window", [8, 300])
def test_flash_window_matches_reference(window):
    from byzantium.kernels import flash
    data = make_batch([(300, 40), (10, 1), (0, 30)], 8, 2, 128, 256, torch.float16, "cuda")
    upcast = {k: (t.float() if t.is_floating_point() else t) for k, t in data.items()}
    ref = reference.append_prefill_attention(**upcast, scale=0.1, window=window)
    assert_matches(flash.append_prefill_attention(**data, scale=0.1, window=window), ref, torch.float16)
    decode = make_batch([(299, 1), (600, 1)], 8, 2, 128, 256, torch.float16, "cuda")
    args = decode_args(decode)
    upcast = [t.float() if t.is_floating_point() else t for t in args]
    ref = reference.paged_decode_attention(*upcast, 0.1, window=window)
    assert_matches(flash.paged_decode_attention(*args, 0.1, window=window), ref, torch.float16)
