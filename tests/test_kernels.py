"""Attention kernels over the paged KV cache.

- The torch reference (the oracle) against a naive dense computation: per sequence, per head, K/V
  gathered token by token and repeated per query head, an explicit causal mask, float64.
- The Triton kernels against the reference. On CUDA they run in this process (fp32, fp16, bf16).
  Without CUDA they run under the Triton interpreter, which must be switched on (TRITON_INTERPRET=1)
  before triton is first imported; another test may already have imported it in this process, so
  `test_triton_kernels_under_interpreter` reruns the `TestTriton` class in a fresh pytest process
  started with the variable set (fp32 and fp16: the interpreter has no bf16 arithmetic).
- The flash-attn module: imports without flash-attn, rejects block sizes flash-attn cannot page.

Every case uses a cache whose unused slots are NaN, block tables that are random permutations padded
with block 0 (an unused, all-NaN block), lengths that are not multiples of the block size, and for
attention a batch mixing fresh prompts, cached-prefix extends and q_len 1 decode rows.

On a GPU machine `python -m pytest tests/test_kernels.py -k "fp16 or bf16"` runs just the half-precision
CUDA cases (bench/gpu_check.sh part 1 runs everything but fp32).
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from byzantium.kernels import attention_ops, reference

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()

# Where the Triton kernels can run in this process, and in which dtypes.
if INTERPRET:
    TRITON_DEVICE, TRITON_DTYPES = "cpu", [torch.float32, torch.float16]
elif HAS_CUDA:
    TRITON_DEVICE, TRITON_DTYPES = "cuda", [torch.float32, torch.float16, torch.bfloat16]
else:
    TRITON_DEVICE, TRITON_DTYPES = None, [torch.float32, torch.float16]

DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# fp32: exact up to summation order. fp16/bf16: compared with the reference in fp32 on the same
# (rounded) inputs; the kernel rounds P to the input dtype before P@V, as flash attention does.
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

# (prefix already cached, new tokens) per sequence: a fresh prompt, decode rows, a prefix-cache hit /
# session extend, a chunk ending exactly on a block boundary, a one-token prompt.
MIXED_BATCH = [(0, 37), (23, 1), (50, 19), (16, 16), (0, 1), (70, 1)]


def _rand(*shape, dtype, device, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def make_paged_cache(seq_lens, num_kv_heads, head_dim, block_size, dtype, device, seed=0):
    """A NaN-filled cache holding random K/V for each sequence's first seq_lens[b] tokens, through a
    random block table. Block 0 is never assigned: tables are padded with it, and it stays NaN."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(blocks_per_seq) + 2  # + the null block 0, + 2 spare all-NaN blocks
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    width = max(blocks_per_seq) + 2  # padded past every sequence's last block
    block_tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for b, n in enumerate(blocks_per_seq):
        block_tables[b, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    for b, n in enumerate(seq_lens):
        for p in range(n):
            block, offset = block_tables[b, p // block_size], p % block_size
            k_cache[block, offset] = _rand(num_kv_heads, head_dim, dtype=dtype, device=device, gen=gen)
            v_cache[block, offset] = _rand(num_kv_heads, head_dim, dtype=dtype, device=device, gen=gen)
    return k_cache, v_cache, block_tables.to(device)


def make_batch(batch, num_heads, num_kv_heads, head_dim, block_size, dtype, device, seed=0):
    """Queries and paged metadata for `batch`, a list of (cached prefix, new tokens) per sequence."""
    seq_lens = [prefix + new for prefix, new in batch]
    k_cache, v_cache, block_tables = make_paged_cache(seq_lens, num_kv_heads, head_dim, block_size,
                                                      dtype, device, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q = _rand(sum(new for _, new in batch), num_heads, head_dim, dtype=dtype, device=device, gen=gen)
    cu_seqlens_q = torch.tensor([0] + [new for _, new in batch], dtype=torch.int32).cumsum(0)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, cu_seqlens_q=cu_seqlens_q.to(torch.int32).to(device),
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device), block_tables=block_tables)


def naive_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale):
    """Dense float64 attention, one sequence and one query head at a time, K/V read token by token."""
    num_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b, total in enumerate(seq_lens.tolist()):
        start, end = cu_seqlens_q[b].item(), cu_seqlens_q[b + 1].item()
        slots = [(block_tables[b, p // block_size].item(), p % block_size) for p in range(total)]
        k = torch.stack([k_cache[blk, off] for blk, off in slots]).double()  # [L, Hkv, D]
        v = torch.stack([v_cache[blk, off] for blk, off in slots]).double()
        k = k.repeat_interleave(num_heads // num_kv_heads, dim=1)  # [L, Hq, D]
        v = v.repeat_interleave(num_heads // num_kv_heads, dim=1)
        for j in range(end - start):
            position = total - (end - start) + j
            for h in range(num_heads):
                scores = (k[:, h] @ q[start + j, h].double()) * scale
                scores[position + 1:] = float("-inf")  # causal
                out[start + j, h] = torch.softmax(scores, 0) @ v[:, h]
    return out


def assert_matches(out, ref, dtype):
    assert not out.isnan().any(), "NaN leaked into the output"
    tol = TOL[dtype]
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), rtol=tol, atol=tol)


# ------------------------------------------------------------------------------ reference vs naive

@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size", [16, 32])
def test_reference_prefill_matches_naive(group, block_size):
    data = make_batch(MIXED_BATCH, 2 * group, 2, 64, block_size, torch.float32, "cpu")
    scale = 64 ** -0.5
    out = reference.append_prefill_attention(**data, scale=scale)
    assert_matches(out, naive_attention(**data, scale=scale), torch.float32)


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size", [16, 32])
def test_reference_decode_matches_naive(group, block_size):
    batch = [(n - 1, 1) for n in (1, 17, 40, 33, 64)]
    data = make_batch(batch, 2 * group, 2, 64, block_size, torch.float32, "cpu")
    scale = 64 ** -0.5
    out = reference.paged_decode_attention(data["q"], data["k_cache"], data["v_cache"], data["seq_lens"],
                                           data["block_tables"], scale)
    assert_matches(out, naive_attention(**data, scale=scale), torch.float32)


def test_reference_store_kv_matches_naive():
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(5, 2, 8, generator=gen), torch.randn(5, 2, 8, generator=gen)
    slots = torch.tensor([3, -1, 17, 0, 9])
    k_cache = torch.full((3, 8, 2, 8), float("nan"))
    v_cache = torch.full((3, 8, 2, 8), float("nan"))
    reference.store_kv(k, v, k_cache, v_cache, slots)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(k_cache[slot // 8, slot % 8], k[t])
            assert torch.equal(v_cache[slot // 8, slot % 8], v[t])
    assert k_cache.isnan().sum() == k_cache.numel() - 4 * 2 * 8  # nothing else written


# ------------------------------------------------------------------------------ Triton vs reference

@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.skipif(TRITON_DEVICE is not None, reason="the Triton kernels run in this process")
def test_triton_kernels_under_interpreter():
    """Run TestTriton in a fresh process with TRITON_INTERPRET=1 set before triton is imported."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{os.path.abspath(__file__)}::TestTriton"]
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"Triton kernel tests failed under the interpreter:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]


# GQA ratio x head_dim x block_size: every pair of values of two of them appears in some case (the
# interpreter is too slow for the full product), for every dtype.
SHAPES = [(1, 64, 16), (1, 128, 32), (2, 64, 32), (2, 128, 16), (4, 64, 16), (4, 128, 32)]


def _triton_cases():
    return [pytest.param(group, head_dim, block_size, dtype,
                         id=f"g{group}-d{head_dim}-bs{block_size}-{DTYPE_IDS[dtype]}")
            for dtype in TRITON_DTYPES for group, head_dim, block_size in SHAPES]


@pytest.fixture(scope="module")
def ops():
    from byzantium.kernels import triton_ops
    return triton_ops


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.skipif(TRITON_DEVICE is None, reason="no CUDA: run by test_triton_kernels_under_interpreter "
                                                  "in a TRITON_INTERPRET=1 process")
class TestTriton:
    @pytest.mark.parametrize("group,head_dim,block_size,dtype", _triton_cases())
    def test_append_prefill(self, ops, group, head_dim, block_size, dtype):
        num_kv_heads = 2
        data = make_batch(MIXED_BATCH, num_kv_heads * group, num_kv_heads, head_dim, block_size, dtype,
                          TRITON_DEVICE, seed=group + head_dim + block_size)
        scale = head_dim ** -0.5
        ref = reference.append_prefill_attention(**_upcast(data), scale=scale)
        assert_matches(ops.append_prefill_attention(**data, scale=scale), ref, dtype)

    @pytest.mark.parametrize("block_m", [16, 64])
    @pytest.mark.parametrize("group", [1, 3, 4])
    def test_append_prefill_tile_sizes(self, ops, group, block_m):
        # Several q tiles per sequence, tiles straddling sequence ends, and spare programs of the
        # upper-bound grid; an empty sequence (no new tokens) in the middle of the batch; a GQA ratio
        # that does not divide the tile (3: rows past BLOCK_Q * 3 are padding).
        batch = [(5, 40), (0, 3), (30, 0), (12, 29), (40, 1)]
        data = make_batch(batch, 2 * group, 2, 64, 16, torch.float32, TRITON_DEVICE, seed=7)
        ref = reference.append_prefill_attention(**data, scale=0.125)
        out = ops.append_prefill_attention(**data, scale=0.125, block_m=block_m)
        assert_matches(out, ref, torch.float32)

    @pytest.mark.parametrize("group,head_dim,block_size,dtype", _triton_cases())
    def test_decode(self, ops, group, head_dim, block_size, dtype):
        num_kv_heads = 2
        # Contexts short and long, not multiples of the block size; some shorter than one split.
        batch = [(n - 1, 1) for n in (1, 20, 77, 150, 33)]
        data = make_batch(batch, num_kv_heads * group, num_kv_heads, head_dim, block_size, dtype,
                          TRITON_DEVICE, seed=group + head_dim + block_size)
        args = [data[k] for k in ("q", "k_cache", "v_cache", "seq_lens", "block_tables")]
        scale = head_dim ** -0.5
        ref = reference.paged_decode_attention(*_upcast_list(args), scale)
        # num_splits=1: one program per (sequence, KV head), no merge kernel; 3: split-K + lse merge,
        # with empty trailing splits for the short sequences.
        for num_splits in (1, 3):
            assert_matches(ops.paged_decode_attention(*args, scale, num_splits=num_splits), ref, dtype)

    @pytest.mark.parametrize("num_splits", [None, 4])
    def test_decode_group_3(self, ops, num_splits):
        # GQA ratio 3 (padded query-head rows); None: the default choice of splits for this device.
        data = make_batch([(299, 1), (8, 1), (64, 1)], 6, 2, 64, 16, torch.float32, TRITON_DEVICE)
        args = [data[k] for k in ("q", "k_cache", "v_cache", "seq_lens", "block_tables")]
        assert_matches(ops.paged_decode_attention(*args, 0.125, num_splits=num_splits),
                       reference.paged_decode_attention(*args, 0.125), torch.float32)

    @pytest.mark.parametrize("num_splits", [1, 3])
    def test_decode_padding_rows_are_zero(self, ops, num_splits):
        # A batch padded to a fixed size (as for a captured CUDA graph): seq_lens 0, block table of 0s.
        data = make_batch([(40, 1), (7, 1)], 4, 2, 64, 16, torch.float32, TRITON_DEVICE)
        args = [data[k] for k in ("q", "k_cache", "v_cache", "seq_lens", "block_tables")]
        q, k_cache, v_cache, seq_lens, block_tables = args
        padded_q = torch.cat([q, torch.randn_like(q)])
        padded_lens = torch.cat([seq_lens, torch.zeros_like(seq_lens)])
        padded_tables = torch.cat([block_tables, torch.zeros_like(block_tables)])
        out = ops.paged_decode_attention(padded_q, k_cache, v_cache, padded_lens, padded_tables, 0.125,
                                         num_splits=num_splits)
        assert_matches(out[:2], reference.paged_decode_attention(*args, 0.125), torch.float32)
        assert torch.equal(out[2:], torch.zeros_like(out[2:]))

    @pytest.mark.parametrize("dtype", TRITON_DTYPES, ids=DTYPE_IDS.get)
    @pytest.mark.parametrize("num_kv_heads,head_dim,block_size", [(1, 64, 16), (2, 128, 32), (3, 64, 16)])
    def test_store_kv(self, ops, num_kv_heads, head_dim, block_size, dtype):
        gen = torch.Generator().manual_seed(0)
        num_tokens = 9
        # k, v as slices of a fused qkv projection: strided over tokens, as the model produces them.
        qkv = _rand(num_tokens, 3 * num_kv_heads, head_dim, dtype=dtype, device=TRITON_DEVICE, gen=gen)
        k, v = qkv[:, num_kv_heads:2 * num_kv_heads], qkv[:, 2 * num_kv_heads:]
        num_slots = 4 * block_size
        slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
        slots[[2, 5]] = -1  # padding tokens
        slots = slots.to(TRITON_DEVICE)
        shape = (4, block_size, num_kv_heads, head_dim)
        caches = [torch.full(shape, float("nan"), dtype=dtype, device=TRITON_DEVICE) for _ in range(4)]
        reference.store_kv(k, v, caches[0], caches[1], slots)
        ops.store_kv(k, v, caches[2], caches[3], slots)
        assert torch.equal(caches[2].isnan(), caches[0].isnan())
        torch.testing.assert_close(caches[2], caches[0], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(caches[3], caches[1], rtol=0, atol=0, equal_nan=True)

    def test_engine_greedy_tokens_match_torch_backend(self, tmp_path):
        # A tiny random Qwen3 whose next token depends on attention (untied, large init: a small tied
        # init just repeats the last token). max_batch_tokens=16 forces chunked prefill and steps that
        # mix decode rows with prefill chunks.
        from transformers import Qwen3Config, Qwen3ForCausalLM
        from byzantium import Engine, SamplingParams
        config = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                             tie_word_embeddings=False, initializer_range=0.3)
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(tmp_path)
        prompts = [[5, 9, 33, 2, 7] * 4, [1, 2, 3], list(range(40, 77))]
        tokens = {}
        for backend in ("torch", "triton"):
            engine = Engine(model=str(tmp_path), device=TRITON_DEVICE, dtype=torch.float32, attention_backend=backend,
                            block_size=16, num_blocks=64, max_num_seqs=8, max_batch_tokens=16)
            outs = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
            tokens[backend] = [o.token_ids for o in outs]
        assert len(set(sum(tokens["torch"], []))) > 3, "the model should not just repeat one token"
        assert tokens["triton"] == tokens["torch"]


def _upcast(data):
    """The reference in fp32 on the same (already rounded) inputs: the oracle for fp16/bf16."""
    return {k: (t.float() if t.is_floating_point() else t) for k, t in data.items()}


def _upcast_list(tensors):
    return [t.float() if t.is_floating_point() else t for t in tensors]


# -------------------------------------------------------------------------------------- flash-attn

def test_flash_module_imports_without_flash_attn_and_checks_block_size():
    from byzantium.kernels import flash
    data = make_batch([(3, 2)], 4, 2, 64, 16, torch.float16, "cpu")
    with pytest.raises(ValueError, match="multiple of 256"):
        flash.append_prefill_attention(**data, scale=0.125)
    with pytest.raises(ValueError, match="block_size=256"):
        flash.paged_decode_attention(data["q"][:1], data["k_cache"], data["v_cache"], data["seq_lens"],
                                     data["block_tables"], 0.125)
    k = torch.randn(3, 2, 8)
    k_cache, v_cache = torch.zeros(2, 16, 2, 8), torch.zeros(2, 16, 2, 8)
    flash.store_kv(k, 2 * k, k_cache, v_cache, torch.tensor([0, -1, 17]))
    assert torch.equal(k_cache[1, 1], k[2]) and torch.equal(v_cache[0, 0], 2 * k[0])


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn is installed")
def test_flash_without_flash_attn_says_what_to_install():
    from byzantium.kernels import flash
    data = make_batch([(3, 2)], 4, 2, 64, 256, torch.float16, "cpu")
    with pytest.raises(RuntimeError, match="flash-attn"):
        flash.append_prefill_attention(**data, scale=0.125)
    with pytest.raises(RuntimeError, match="flash-attn"):
        attention_ops("flash_attn")


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None or not HAS_CUDA,
                    reason="needs flash-attn and CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
def test_flash_matches_reference(dtype):
    from byzantium.kernels import flash
    data = make_batch([(300, 40), (10, 1), (0, 30)], 8, 2, 128, 256, dtype, "cuda")
    scale = 128 ** -0.5
    ref = reference.append_prefill_attention(**_upcast(data), scale=scale)
    assert_matches(flash.append_prefill_attention(**data, scale=scale), ref, dtype)
    decode = make_batch([(299, 1), (600, 1)], 8, 2, 128, 256, dtype, "cuda")
    args = [decode[k] for k in ("q", "k_cache", "v_cache", "seq_lens", "block_tables")]
    assert_matches(flash.paged_decode_attention(*args, scale), reference.paged_decode_attention(*_upcast_list(args), scale),
                   dtype)


def test_dispatch_looks_up_the_chosen_backend():
    from byzantium.kernels import cpu
    assert attention_ops("cpu") is cpu and attention_ops("torch") is reference
    with pytest.raises(ValueError, match="attention_backend"):
        attention_ops("xformers")
    with pytest.raises(ValueError, match="choose_attention_backend"):  # nothing is chosen here
        attention_ops("auto")


def test_the_cpu_kernels_build_wherever_they_are_supported():
    """Every test of tests/test_cpu_kernels.py skips when load() is None: a build that breaks fails here."""
    from byzantium.kernels import cpu_ext
    if not cpu_ext.supported():
        pytest.skip(str(cpu_ext.unsupported_reason()))
    assert cpu_ext.load() is not None
    assert cpu_ext.source_digest() in cpu_ext.load().__name__
