"""The CUDA step's host-side logic, run on the CPU: buckets, the StepBuffers layout and filling
(unpinned), padding a decode step to its bucket, the fixed split count, and the lazy graph bookkeeping
with a stand-in for capture (it re-runs the captured forward on the same buffers, as a replay would)."""
import importlib.util
import os
import subprocess
import sys
import types

import pytest
import torch

from byzantium import Engine, SamplingParams
from byzantium.engine import cuda_graphs
from byzantium.engine.cuda_graphs import BUCKETS, DecodeGraphs, FixedSplits, bucket_for, buckets_for
from byzantium.engine.runner import ModelRunner, layout
from byzantium.kernels import reference
from conftest import random_prompts

MAX_SEQS, MAX_TOKENS = 8, 64
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
TRITON_DEVICE = "cpu" if INTERPRET else "cuda" if torch.cuda.is_available() else None


def test_buckets():
    assert buckets_for(256) == BUCKETS and buckets_for(1000) == BUCKETS
    assert buckets_for(48) == (1, 2, 4, 8, 16, 32) and buckets_for(1) == (1,)
    assert [bucket_for(n, buckets_for(48)) for n in (1, 2, 3, 5, 16, 17, 32, 33)] == [1, 2, 4, 8, 16, 32, 32, None]


def test_layout_depends_only_on_sizes_and_is_aligned():
    a, end = layout(8, 8, 0, 32, 0, 3)
    b, _ = layout(8, 8, 0, 32, 0, 8)  # another step of the same bucket: fewer rows end their sequence
    assert {k: v for k, v in a.items() if k != "logit_index"} == {k: v for k, v in b.items() if k != "logit_index"}
    for start, count, dtype in a.values():
        assert start % dtype.itemsize == 0
    assert a["input_ids"][0] == 0 and end >= a["logit_index"][0] + 3 * 8
    c, _ = layout(5, 1, 1, 2, 3, 2)  # mixed step: fields follow one another without overlap
    spans = sorted((s, s + n * d.itemsize) for s, n, d in c.values() if n)
    assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))


def make_engine(path, graphs=False, **kwargs):
    """An engine whose runner stages steps on the CPU (unpinned buffers), as it does on CUDA."""
    engine = Engine(path, device="cpu", num_blocks=96, max_num_seqs=MAX_SEQS, max_batch_tokens=MAX_TOKENS,
                    attention_backend="torch", **kwargs)
    engine.runner.stage(MAX_SEQS, MAX_TOKENS, engine.max_model_len, cuda_graphs=graphs, pin=False)
    return engine


def test_staged_step_equals_the_list_step(tiny_llama, monkeypatch):
    """Every prepare of a run with prefill, chunked prefill, mixed and decode steps: the staged tensors
    equal the ones built from lists (values and dtypes)."""
    _, path = tiny_llama
    monkeypatch.setenv("BYZANTIUM_LINEAR_KERNELS", "torch")  # one kernel for both phases: mixed steps stay fused
    engine = make_engine(path)
    runner, checked = engine.runner, []

    def tensors(step, pad_to=None):
        staged = ModelRunner.tensors(runner, step, pad_to)
        buffers, runner.buffers = runner.buffers, None
        listed = ModelRunner.tensors(runner, step)
        runner.buffers = buffers
        for x, y in zip(staged[:2], listed[:2]):
            assert x.dtype == y.dtype and torch.equal(x, y)
        for name in ("slot_mapping", "decode_seq_lens", "decode_block_tables", "cu_seqlens_q", "prefill_seq_lens",
                     "prefill_block_tables"):
            x, y = getattr(staged[2], name), getattr(listed[2], name)
            assert (x is None) == (y is None), name
            if x is not None:
                assert x.dtype == y.dtype and torch.equal(x, y), name
        assert staged[2].num_decode == listed[2].num_decode
        if step.logit_rows:
            assert staged[2].logit_index.tolist() == step.logit_rows
        checked.append({bool(step.decode_lens), bool(step.prefill_lens)})
        return staged

    runner.tensors = tensors
    prompts = random_prompts([70, 5, 33, 12, 90], seed=31)  # 70 and 90 > max_batch_tokens: chunked
    outs = engine.generate(prompts, SamplingParams(max_tokens=6))
    plain = Engine(path, device="cpu", num_blocks=96, max_num_seqs=MAX_SEQS, max_batch_tokens=MAX_TOKENS,
                   attention_backend="torch")
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain.generate(prompts, SamplingParams(max_tokens=6))]
    # (has decode rows, has prefill rows): decode, prefill and mixed steps were all checked
    assert {True, False} in checked and {False, True} in checked and {True} in checked


def test_padded_decode_step_matches_unpadded(tiny_llama):
    _, path = tiny_llama
    engine = make_engine(path)
    seqs = engine.add_requests(random_prompts([9, 20, 3], seed=32), SamplingParams(max_tokens=4))
    engine.step()  # the prefill; the next step decodes the three
    rows = engine.scheduler.schedule()
    assert all(r.num_tokens == 1 for r in rows)
    runner = engine.runner
    input_ids, positions, meta, logit_rows, _ = runner.prepare(rows, pad_to=4)
    assert input_ids.shape == (4,) and meta.num_decode == 4
    assert meta.slot_mapping[3] == -1 and meta.decode_seq_lens.tolist()[3] == 0
    assert meta.decode_block_tables.shape == (4, runner.buffers.max_blocks)
    for i, row in enumerate(sorted(rows, key=lambda r: r.num_tokens > 1)):
        table = row.seq.block_table
        assert meta.decode_block_tables[i, :len(table)].tolist() == table
    with torch.inference_mode():
        padded = runner.model(input_ids, positions, meta, runner.kv_cache)[logit_rows]
        input_ids, positions, meta, logit_rows, _ = runner.prepare(rows)
        plain = runner.model(input_ids, positions, meta, runner.kv_cache)[logit_rows]
    torch.testing.assert_close(padded, plain)
    with pytest.raises(ValueError):
        runner.prepare(rows, pad_to=2)
    for seq in seqs:
        engine.abort(seq)


def test_fixed_splits_come_from_max_model_len_and_the_rows_bucket():
    calls = []
    ops = types.SimpleNamespace(
        __name__="byzantium.kernels.triton_ops", store_kv="store",
        _decode_num_splits=lambda batch, heads, context, device: (batch, heads, context),
        paged_decode_attention=lambda *args, num_splits=None: calls.append((args[-1], num_splits)))
    fixed = FixedSplits(ops, max_model_len=4096)
    q, cache = torch.zeros(8, 4, 16), torch.zeros(10, 16, 2, 16)
    tables = torch.zeros(8, 3, dtype=torch.int32)  # this step's contexts are short: not what decides
    fixed.paged_decode_attention(q, cache, cache, None, tables, 0.1)
    fixed.paged_decode_attention(q, cache, cache, None, tables, 0.1, window=512)
    fixed.paged_decode_attention(q[:3], cache, cache, None, tables[:3], 0.1)  # eager, 3 rows: as bucket 4
    assert calls == [(None, (8, 2, 4096)), (512, (8, 2, 512)), (None, (4, 2, 4096))]
    assert fixed.store_kv == "store" and fixed.__name__ == "byzantium.kernels.triton_ops"
    plain = FixedSplits(types.SimpleNamespace(__name__="byzantium.kernels.reference",
                                              paged_decode_attention=lambda *args: "ref"), 4096)
    assert plain.paged_decode_attention(q, cache, cache, None, tables, 0.1) == "ref"


class FakeGraph:
    """Stands in for a CUDA graph: replay runs the captured forward again on the same buffers and
    writes into the captured output, which is what a real replay does to the same addresses."""

    def __init__(self, forward, output):
        self.forward, self.output, self.replays = forward, output, 0

    def replay(self):
        reference._memo.clear()  # the torch reference memoises on the (here reused) metadata tensors
        self.output.copy_(self.forward())
        self.replays += 1

    def pool(self):
        return "pool"


def fake_record(forward, pool, stream):
    forward()
    output = forward()
    return FakeGraph(forward, output), output


def test_graphed_decode_gives_the_eager_tokens(tiny_llama, monkeypatch):
    _, path = tiny_llama
    monkeypatch.setattr(cuda_graphs, "record", fake_record)
    prompts = random_prompts([14, 3, 27, 8, 40], seed=33)
    params = [SamplingParams(max_tokens=12), SamplingParams(max_tokens=7, temperature=1.0, seed=3),
              SamplingParams(max_tokens=12, temperature=0.8, top_k=5, seed=4), SamplingParams(max_tokens=3),
              SamplingParams(max_tokens=12)]
    eager = Engine(path, device="cpu", num_blocks=96, max_num_seqs=MAX_SEQS, max_batch_tokens=MAX_TOKENS,
                   attention_backend="torch")
    expected = [o.token_ids for o in eager.generate(prompts, params)]
    engine = make_engine(path, graphs=True)
    replayed, run = [], engine.runner.graphs.run
    engine.runner.graphs.run = lambda bucket, *a: replayed.append(bucket) or run(bucket, *a)
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected
    assert 8 in replayed and 4 in replayed  # 5 decoding rows -> bucket 8; 3 or 4 -> bucket 4
    graphs = engine.describe()["cuda_graphs"]
    assert graphs == {"enabled": True, "buckets": [1, 2, 4, 8], "captured": sorted(set(replayed))}
    assert all(graph.replays >= 1 for graph, _, _ in engine.runner.graphs.graphs.values())
    # one more request: replays again, same tokens as alone in the eager engine
    assert engine.generate(prompts[:1], params[:1])[0].token_ids == expected[0]


def test_failed_capture_turns_graphs_off(tiny_llama, monkeypatch, caplog):
    _, path = tiny_llama

    def failing(forward, pool, stream):
        forward()
        raise cuda_graphs.CaptureFailed("RuntimeError: operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graphs, "record", failing)
    prompts = random_prompts([10, 6], seed=34)
    eager = Engine(path, device="cpu", num_blocks=96, max_num_seqs=MAX_SEQS, max_batch_tokens=MAX_TOKENS,
                   attention_backend="torch")
    expected = [o.token_ids for o in eager.generate(prompts, SamplingParams(max_tokens=5))]
    engine = make_engine(path, graphs=True)
    assert [o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=5))] == expected
    described = engine.describe()["cuda_graphs"]
    assert described["enabled"] is False and "stream is capturing" in described["off_reason"]
    assert "CUDA graphs turned off" in caplog.text
    assert engine.runner.graphs.bucket(engine.scheduler.running) is None


def test_graph_inputs_must_not_move():
    graphs = DecodeGraphs(8, 4, torch.device("cpu"))
    graphs.graphs[2] = (FakeGraph(lambda: torch.zeros(1), torch.zeros(1)), torch.zeros(1), (1, 2))
    with pytest.raises(RuntimeError, match="inputs moved"):
        graphs.run(2, None, (1, 3))


def test_cpu_engines_are_eager(tiny_llama):
    _, path = tiny_llama
    for engine in (Engine(path, device="cpu", num_blocks=16), Engine(path, device="cpu", num_blocks=16, enforce_eager=True)):
        assert engine.describe()["cuda_graphs"] == {"enabled": False, "off_reason": "eager (cpu)"}
        assert engine.runner.buffers is None and engine.runner.graphs is None


# ----------------------------------------------------------------------------- the real kernels / GPU

@pytest.mark.skipif(TRITON_DEVICE is None, reason="needs CUDA or TRITON_INTERPRET=1 (see the test below)")
@pytest.mark.parametrize("num_splits", [1, 4])
def test_triton_kernels_on_graph_shaped_metadata(num_splits):
    """What a graphed step hands the Triton kernels: tables max_blocks wide whose entries past a sequence's
    blocks are garbage (never read), a padding row of length 0 (zeros out) and slot -1 (nothing stored)."""
    from byzantium.kernels import triton_ops
    device, g = TRITON_DEVICE, torch.Generator().manual_seed(5)
    block_size, kv_heads, heads, head_dim, num_blocks, max_blocks = 16, 2, 4, 32, 24, 8
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"))
    v_cache = k_cache.clone()
    lengths, free, tables = [37, 5, 70], torch.randperm(num_blocks, generator=g).tolist(), []
    for n in lengths:
        blocks = [free.pop() for _ in range(-(-n // block_size))]
        tables.append(blocks)
        for p in range(n):
            k_cache[blocks[p // block_size], p % block_size] = torch.randn(kv_heads, head_dim, generator=g)
            v_cache[blocks[p // block_size], p % block_size] = torch.randn(kv_heads, head_dim, generator=g)
    k_cache, v_cache = k_cache.to(device), v_cache.to(device)
    wide = torch.full((4, max_blocks), 10**6, dtype=torch.int32)  # out of range: must never be read
    for i, t in enumerate(tables):
        wide[i, :len(t)] = torch.tensor(t)
    compact = torch.tensor([t + [t[0]] * (5 - len(t)) for t in tables], dtype=torch.int32)
    q = torch.randn(4, heads, head_dim, generator=g).to(device)
    seq_lens = torch.tensor(lengths + [0], dtype=torch.int32, device=device)
    out = triton_ops.paged_decode_attention(q, k_cache, v_cache, seq_lens, wide.to(device), 0.2, num_splits=num_splits)
    expected = reference.paged_decode_attention(q[:3], k_cache, v_cache, seq_lens[:3], compact.to(device), 0.2)
    torch.testing.assert_close(out[:3], expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(out[3], torch.zeros_like(out[3]))
    new = torch.randn(4, kv_heads, head_dim, generator=g).to(device)
    slots = torch.tensor([tables[0][2] * block_size + 5, tables[1][0] * block_size + 5, tables[2][4] * block_size + 6, -1],
                         device=device)
    before = k_cache.clone()
    triton_ops.store_kv(new, new, k_cache, v_cache, slots)
    changed = ~((k_cache == before) | (k_cache.isnan() & before.isnan())).view(-1, kv_heads * head_dim).all(-1)
    assert sorted(torch.nonzero(changed)[:, 0].tolist()) == sorted(slots[:3].tolist())


@pytest.mark.skipif(not HAS_TRITON or TRITON_DEVICE is not None, reason="runs in this process")
def test_triton_kernels_on_graph_shaped_metadata_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(__file__),
           "-k", "test_triton_kernels_on_graph_shaped_metadata and not interpreter"]
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_real_cuda_graphs_match_eager(tiny_models):
    """On a GPU: graphed decode gives the eager engine's tokens (fp32, greedy and seeded), the buckets it
    used are captured, and a step makes one host sync."""
    _, path = tiny_models["qwen3"]
    prompts = random_prompts([14, 3, 27, 8, 40, 9, 2, 30, 11], seed=35)
    params = [SamplingParams(max_tokens=10), SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=2)] * 4
    params.append(SamplingParams(max_tokens=6, temperature=1.0, top_k=7, seed=3))
    outs = {}
    for eager in (True, False):
        engine = Engine(path, device="cuda", dtype="float32", num_blocks=128, max_num_seqs=16, max_model_len=128,
                        enforce_eager=eager)
        assert engine.runner.buffers is not None and engine.runner.buffers.host.is_pinned()
        outs[eager] = [o.token_ids for o in engine.generate(prompts, params)]
        graphs = engine.describe()["cuda_graphs"]
        assert graphs["enabled"] is (not eager)
    assert outs[False] == outs[True]
    assert graphs["buckets"] == [1, 2, 4, 8, 16] and 16 in graphs["captured"], graphs
