"""The compiled CPU kernels against torch: the panel linears (cpu_gemm.h, at AVX2 and AVX-512 width) against
F.linear, the paged decode attention (cpu_decode.h, both widths) and prefill attention (cpu_prefill.h) against
kernels/reference.py, the layer ops (cpu_layer_ops.h) against the torch formulas."""
import pytest
import torch
import torch.nn.functional as F

from byzantium.kernels import cpu_ext

ext = cpu_ext.load() if cpu_ext.supported() else None
pytestmark = pytest.mark.skipif(ext is None, reason="no AVX2 CPU, C++ compiler or ninja: the engine uses oneDNN")


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 32, 97, 600])  # 600: chunks of rows shared out
@pytest.mark.parametrize("k, n", [(64, 128), (576, 960), (37, 5), (1536, 576), (16, 1), (8, 33)])
@pytest.mark.parametrize("bias", [False, True])
def test_panel_linear_matches_torch_linear_and_is_batch_invariant(rows, k, n, bias):
    g = torch.Generator().manual_seed(rows * 1000 + k + n)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    panels = ext.pack_panels(w)
    assert panels.shape == (-(-n // 16), k, 16)
    padded = None if b is None else torch.cat([b, b.new_zeros(panels.shape[0] * 16 - n)])
    got = ext.panel_linear(x, panels, padded, n)
    assert got.shape == (rows, n)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5 * k ** 0.5)
    # a row's result is the same in any block of rows, and whether the rows are split by panel or by chunk
    for m in {1, rows // 2, rows - 1} - {0}:
        assert torch.equal(ext.panel_linear(x[rows - m:], panels, padded, n), got[rows - m:])


@pytest.mark.skipif(ext is None or not ext.avx512_supported(), reason="no AVX-512 on this CPU")
@pytest.mark.parametrize("rows", [1, 2, 13, 14, 15, 29, 97, 600])  # 600: chunks of rows shared out
@pytest.mark.parametrize("k, n", [(64, 128), (576, 960), (37, 5), (1536, 576), (16, 1), (8, 33), (40, 48)])
@pytest.mark.parametrize("bias", [False, True])
def test_avx512_panel_linear_matches_torch_linear_and_is_batch_invariant(rows, k, n, bias):
    g = torch.Generator().manual_seed(rows * 1000 + k + n)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    panels = ext.pack_panels512(w)
    assert panels.shape == (-(-n // 32), k, 32)
    padded = None if b is None else torch.cat([b, b.new_zeros(panels.shape[0] * 32 - n)])
    got = ext.panel_linear512(x, panels, padded, n)
    assert got.shape == (rows, n)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5 * k ** 0.5)
    # a row's result is the same in any block of rows (the 14-row blocks and the remainder alike)
    for m in {1, rows // 2, rows - 1} - {0}:
        assert torch.equal(ext.panel_linear512(x[rows - m:], panels, padded, n), got[rows - m:])
    with pytest.raises(RuntimeError, match="N does not match"):
        ext.panel_linear512(x, panels, None, panels.shape[0] * 32 + 1)


@pytest.mark.parametrize("kind", ["panels", "panels512"])
@pytest.mark.parametrize("rows", [1, 14, 31, 300])  # 300: chunks of rows shared out
@pytest.mark.parametrize("k, inner", [(576, 1536), (40, 24), (16, 5)])  # I a multiple of 16, of 8 only, of neither
@pytest.mark.parametrize("bias", [False, True])
def test_fused_glu_matches_the_linear_then_silu_mul(kind, rows, k, inner, bias):
    from byzantium.engine.layers.linear import PackedLinear
    from byzantium.kernels.linear_choice import Panels, Panels512
    if kind == "panels512" and not ext.avx512_supported():
        pytest.skip("no AVX-512 on this CPU")
    kernel, glu_kernel, width = {"panels": (Panels(ext), ext.panel_glu, 8),
                                 "panels512": (Panels512(ext), ext.panel_glu512, 16)}[kind]
    g = torch.Generator().manual_seed(rows + k + inner)
    linear = torch.nn.Linear(k, 2 * inner, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(2 * inner, k, generator=g) / k ** 0.5)
        if bias:
            linear.bias.copy_(torch.randn(2 * inner, generator=g))
    x = torch.randn(rows, k, generator=g) * 2
    packed = PackedLinear(linear, kernel)
    gate_up = packed(x)
    glu, panels, glu_bias, half = packed.repack_glu(ext)
    assert glu is glu_kernel and half == inner and packed.glu == width and panels.shape[0] == -(-inner // width)
    # The GEMM of each column is the same chain of FMAs in either packing: the repacked linear gives the
    # same gate_up, and the fused pass silu(gate) * up of it.
    assert torch.equal(packed(x), gate_up)
    fused = glu(x, panels, glu_bias, inner)
    torch.testing.assert_close(fused, ext.silu_mul(gate_up), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fused, F.silu(gate_up[:, :inner]) * gate_up[:, inner:], rtol=1e-5, atol=1e-5)
    assert torch.equal(glu(x[rows // 2:], panels, glu_bias, inner), fused[rows // 2:])  # batch invariant
    assert packed.repack_glu(ext)[1] is panels  # once
    with pytest.raises(RuntimeError, match="I does not match"):
        glu(x, panels, None, panels.shape[0] * width + 1)


@pytest.mark.parametrize("kind", ["panels", "panels512"])
def test_engine_fuses_gate_up_with_silu_on_the_panels(kind, tiny_llama, monkeypatch):
    from byzantium import Engine, SamplingParams
    from byzantium.engine.layers.mlp import GatedMLP
    if kind == "panels512" and not ext.avx512_supported():
        pytest.skip("no AVX-512 on this CPU")
    monkeypatch.setenv("BYZANTIUM_LINEAR_KERNELS", kind)
    fused = Engine(tiny_llama[1], num_blocks=64)
    mlps = [m for m in fused.model.modules() if isinstance(m, GatedMLP)]
    assert mlps and all(m.glu is not None for m in mlps)
    assert fused.describe()["fused_gate_up_silu"] == len(mlps)
    plain = Engine(tiny_llama[1], num_blocks=64, attention_backend="torch")
    plain.model.use_cpu_ops(None)  # torch layer ops; its gate_up stays in the fused layout, put back in order
    assert all(m.glu is None and m.gate_up_proj.glu for m in plain.model.modules() if isinstance(m, GatedMLP))
    prompts = [list(range(3, 3 + n)) for n in (4, 17, 40)]
    params = SamplingParams(max_tokens=10, ignore_eos=True, logprobs=1)
    got, want = fused.generate(prompts, params), plain.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for a, b in zip(got, want):
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.keys() == y.keys() and all(abs(x[t] - y[t]) < 1e-4 for t in x)


def test_panel_linear_non_contiguous_input_and_bad_calls():
    x = torch.randn(8, 64)[::2]  # rows 0, 2, 4, 6: a strided view
    w = torch.randn(32, 64)
    panels = ext.pack_panels(w)
    torch.testing.assert_close(ext.panel_linear(x, panels, None, 32), F.linear(x, w), rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="no rows"):
        ext.panel_linear(torch.randn(0, 64), panels, None, 32)
    with pytest.raises(RuntimeError, match="fp32"):
        ext.panel_linear(torch.randn(1, 64, dtype=torch.float64), panels, None, 32)
    with pytest.raises(RuntimeError, match="N does not match"):
        ext.panel_linear(torch.randn(1, 64), panels, None, 33)
    with pytest.raises(RuntimeError, match="bias"):
        ext.panel_linear(torch.randn(1, 64), panels, torch.randn(30), 30)


def test_engine_packs_its_linears_on_the_chosen_kernels(tiny_llama):
    from byzantium import Engine, SamplingParams
    from byzantium.engine.layers.linear import PackedLinear
    engine = Engine(tiny_llama[1], num_blocks=64)
    layer = engine.model.model.layers[0].mlp.down_proj
    chosen = engine.describe()["linear_kernels"][f"{layer.in_features}x{layer.out_features}"]
    assert isinstance(layer, PackedLinear) and layer.kernel.name == chosen
    assert chosen in {"panels", "panels512", "onednn", "torch"}
    x = torch.randn(3, layer.in_features)
    plain = Engine(tiny_llama[1], num_blocks=64, cpu_packed_linears=False)
    reference = plain.model.model.layers[0].mlp.down_proj
    assert isinstance(reference, torch.nn.Linear)
    torch.testing.assert_close(layer(x), reference(x), rtol=1e-5, atol=1e-5)
    # Without the compiled kernels: oneDNN's packing and the torch attention, the same tokens.
    off = Engine(tiny_llama[1], num_blocks=64, cpu_kernels=False)
    assert off.model.model.layers[0].mlp.down_proj.kernel.name == "onednn"
    from byzantium.kernels import reference as torch_attention
    assert off.runner.ops is torch_attention
    prompts = [[5, 6, 7, 8, 9], list(range(10, 40))] * 6  # 12 rows
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    assert [o.token_ids for o in engine.generate(prompts, params)] == want
    assert [o.token_ids for o in off.generate(prompts, params)] == want


def paged_case(batch, num_heads, num_kv_heads, head_dim, block_size, max_len, seed, min_lengths=None):
    """A block pool filled with NaN except the slots the sequences own, in shuffled block order."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (batch,), generator=g, dtype=torch.int32)
    lengths[0] = max_len
    if min_lengths is not None:
        lengths = torch.maximum(lengths, torch.tensor(min_lengths, dtype=torch.int32))
    width = -(-max_len // block_size)
    num_blocks = batch * width + 5
    tables = torch.randperm(num_blocks, generator=g)[:batch * width].view(batch, width).to(torch.int32)
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    v_cache = k_cache.clone()
    for b, length in enumerate(lengths.tolist()):
        for pos in range(length):
            block, offset = tables[b, pos // block_size], pos % block_size
            k_cache[block, offset] = 3 * torch.randn(num_kv_heads, head_dim, generator=g)
            v_cache[block, offset] = torch.randn(num_kv_heads, head_dim, generator=g)
    q = torch.randn(batch, num_heads, head_dim, generator=g)
    return q, k_cache, v_cache, lengths, tables


@pytest.mark.parametrize("batch, num_heads, num_kv_heads, head_dim, block_size, max_len", [
    (1, 9, 3, 64, 16, 1),      # one token: the softmax of a single score
    (6, 9, 3, 64, 16, 75),     # SmolLM2's heads, ragged lengths, partial last blocks
    (5, 4, 4, 32, 1, 23),      # no GQA, one-token blocks
    (3, 4, 2, 16, 16, 50),     # the tiny test models' head size
    (4, 8, 2, 128, 32, 130),   # group of 4, head_dim 128
    (3, 12, 4, 80, 8, 40),
    (2, 2, 2, 256, 16, 33),
    (2, 2, 1, 64, 16, 1100),   # long context
    (5, 20, 2, 32, 16, 90),    # a group of 10: the AVX-512 kernel takes it in two rounds
])
@pytest.mark.parametrize("avx512", [True, False])  # AVX-512 width where the CPU has it; AVX2 width
def test_decode_attention_matches_reference(batch, num_heads, num_kv_heads, head_dim, block_size, max_len, avx512):
    from byzantium.kernels import reference
    q, k_cache, v_cache, lengths, tables = paged_case(batch, num_heads, num_kv_heads, head_dim, block_size, max_len,
                                                      seed=batch * 100 + head_dim + max_len)
    scale = head_dim ** -0.5
    want = reference.paged_decode_attention(q, k_cache, v_cache, lengths, tables, scale)
    got = ext.paged_decode_attention(q, k_cache, v_cache, lengths, tables, scale, avx512=avx512)
    assert torch.isfinite(got).all()  # the NaN outside the sequences' slots never leaks
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Query rows with a stride (q heads sliced out of the QKV projection, as the models pass them): read in place.
    wide = torch.cat([q, torch.randn(batch, 2, head_dim)], dim=1)[:, :num_heads]
    assert wide.stride(0) == (num_heads + 2) * head_dim
    assert torch.equal(ext.paged_decode_attention(wide, k_cache, v_cache, lengths, tables, scale, avx512=avx512), got)



@pytest.mark.parametrize("head_dim, max_len", [(64, 75), (16, 50), (128, 300)])
@pytest.mark.parametrize("avx512", [True, False])
def test_decode_attention_reads_a_bf16_cache(head_dim, max_len, avx512):
    from byzantium.kernels import cpu, reference
    q, k_cache, v_cache, lengths, tables = paged_case(5, 8, 2, head_dim, 16, max_len, seed=head_dim + max_len)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    scale = head_dim ** -0.5
    # Widening bf16 is exact: the kernel on the bf16 pool equals fp32 attention over the same values.
    want = reference.paged_decode_attention(q, k16.float(), v16.float(), lengths, tables, scale)
    got = ext.paged_decode_attention(q, k16, v16, lengths, tables, scale, avx512=avx512)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Through the backend, bf16 queries in and out (as a bf16 engine calls it).
    out = cpu.paged_decode_attention(q.bfloat16(), k16, v16, lengths, tables, scale)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference.paged_decode_attention(
        q.bfloat16().float(), k16.float(), v16.float(), lengths, tables, scale), rtol=1e-2, atol=1e-2)
    with pytest.raises(RuntimeError, match="fp32 queries"):
        ext.paged_decode_attention(q.bfloat16(), k16, v16, lengths, tables, scale)

@pytest.mark.parametrize("limit", [0, 4, 32])
@pytest.mark.parametrize("new_tokens", [[1, 1, 1], [3, 0, 7], [32, 2, 5], [33, 1, 1], [40, 3, 9]])
def test_append_prefill_goes_row_by_row_per_sequence_and_matches_reference(new_tokens, limit, monkeypatch):
    from byzantium.kernels import cpu, reference
    batch, block_size = len(new_tokens), 16
    _, k_cache, v_cache, lengths, tables = paged_case(batch, 9, 3, 64, block_size, 90, seed=sum(new_tokens),
                                                      min_lengths=new_tokens)  # the new tokens' K/V are stored
    cu = torch.tensor([0] + new_tokens, dtype=torch.int32).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), 9, 64, generator=torch.Generator().manual_seed(3))
    calls = []
    real = ext.paged_decode_attention
    spy = type("Spy", (), {"decode_supported": staticmethod(ext.decode_supported),
                           "prefill_supported": staticmethod(ext.prefill_supported), "avx512_supported": staticmethod(ext.avx512_supported),
                           "paged_prefill_attention": staticmethod(ext.paged_prefill_attention),
                           "paged_decode_attention": staticmethod(
                               lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))})
    monkeypatch.setattr(cpu.cpu_ext, "load", lambda: spy)
    monkeypatch.setattr(cpu, "row_limit", lambda *shape: limit)  # what this machine might have measured
    got = cpu.append_prefill_attention(q, k_cache, v_cache, cu, lengths, tables, 0.125)
    want = reference.append_prefill_attention(q, k_cache, v_cache, cu, lengths, tables, 0.125)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Each sequence by its own new tokens: the short ones' tokens in one row-by-row call.
    short = sum(n for n in new_tokens if 0 < n <= limit)
    assert calls == ([short] if short else [])


def prefill_case(new_tokens, cached, num_heads, num_kv_heads, head_dim, block_size, seed):
    """Sequences of `cached` + `new_tokens` tokens in a NaN-filled pool (their K/V stored) and the queries of
    their new tokens: the arguments of append_prefill_attention."""
    lengths = [c + n for c, n in zip(cached, new_tokens)]
    _, k_cache, v_cache, seq_lens, tables = paged_case(len(lengths), num_heads, num_kv_heads, head_dim, block_size,
                                                       max(lengths), seed, min_lengths=lengths)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)  # exactly these lengths (the pool holds at least them)
    cu = torch.tensor([0] + new_tokens, dtype=torch.int32).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), num_heads, head_dim, generator=torch.Generator().manual_seed(seed + 1))
    return q, k_cache, v_cache, cu, seq_lens, tables


needs_avx512 = pytest.mark.skipif(ext is None or not ext.prefill_supported(64), reason="no AVX-512 on this CPU")


@needs_avx512
@pytest.mark.parametrize("new_tokens, cached, num_heads, num_kv_heads, head_dim, block_size", [
    ([1], [0], 9, 3, 64, 16),                    # one token
    ([128], [0], 9, 3, 64, 16),                  # SmolLM2's heads: a prompt of 8 full tiles
    ([100, 3, 0, 77], [0, 40, 9, 300], 9, 3, 64, 16),  # appends to cached prefixes, an idle sequence
    ([70, 33], [0, 12], 4, 4, 128, 32),          # no GQA, head_dim 128
    ([50, 9], [5, 0], 16, 2, 32, 1),             # group of 8, one-token blocks
    ([23], [0], 4, 2, 16, 16),                   # the tiny test models' head size
    ([40], [3], 2, 1, 80, 8),
    ([20], [17], 4, 2, 256, 16),
    ([300], [0], 6, 2, 64, 16),                  # tiles straddling chunk and block ends
])
def test_prefill_attention_matches_reference(new_tokens, cached, num_heads, num_kv_heads, head_dim, block_size):
    from byzantium.kernels import reference
    args = prefill_case(new_tokens, cached, num_heads, num_kv_heads, head_dim, block_size,
                        seed=sum(new_tokens) + head_dim)
    scale = head_dim ** -0.5
    want = reference.append_prefill_attention(*args, scale)
    got = ext.paged_prefill_attention(*args, scale)
    assert torch.isfinite(got).all()  # the NaN outside the sequences' slots never leaks
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Query rows with a stride (q heads sliced out of the QKV projection): read in place, same result.
    q = args[0]
    wide = torch.cat([q, torch.randn(q.shape[0], 3, head_dim)], dim=1)[:, :num_heads]
    assert torch.equal(ext.paged_prefill_attention(wide, *args[1:], scale), got)


@needs_avx512
def test_prefill_attention_reads_a_bf16_cache_and_rejects_bad_calls():
    from byzantium.kernels import cpu, reference
    q, k_cache, v_cache, cu, lengths, tables = prefill_case([60, 5], [10, 30], 8, 2, 64, 16, seed=4)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    want = reference.append_prefill_attention(q, k16.float(), v16.float(), cu, lengths, tables, 0.125)
    torch.testing.assert_close(ext.paged_prefill_attention(q, k16, v16, cu, lengths, tables, 0.125), want,
                               rtol=1e-5, atol=1e-5)
    out = cpu.append_prefill_attention(q.bfloat16(), k16, v16, cu, lengths, tables, 0.125)
    assert out.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="fp32 queries"):  # bf16 queries only with a bf16 cache
        ext.paged_prefill_attention(q.bfloat16(), k_cache, v_cache, cu, lengths, tables, 0.125)
    with pytest.raises(RuntimeError, match="has 60 new tokens and length 50"):
        ext.paged_prefill_attention(q, k_cache, v_cache, cu, torch.tensor([50, 35], dtype=torch.int32), tables, 0.1)
    with pytest.raises(RuntimeError, match="cu_seqlens_q"):
        ext.paged_prefill_attention(q[:-1], k_cache, v_cache, cu, lengths, tables, 0.1)
    assert not ext.prefill_supported(60)


@needs_avx512
@pytest.mark.skipif(ext is None or not ext.avx512_bf16_supported(), reason="no avx512_bf16 on this CPU")
@pytest.mark.parametrize("new_tokens, cached, num_heads, num_kv_heads, head_dim, block_size", [
    ([128], [0], 9, 3, 64, 16),
    ([100, 3, 0, 77], [0, 40, 9, 300], 9, 3, 64, 16),
    ([70, 33], [0, 12], 4, 4, 128, 32),
    ([50, 9], [5, 0], 16, 2, 32, 1),
    ([40], [3], 2, 1, 80, 8),                    # head_dim not a multiple of 16
    ([300], [0], 6, 2, 64, 16),
])
def test_prefill_attention_with_bf16_queries_scores_with_bf16_dot_products(new_tokens, cached, num_heads,
                                                                          num_kv_heads, head_dim, block_size):
    """bf16 queries and cache: both products on bf16 dot products (softmax weights rounded to bf16, as flash
    attention does), bf16 output: within bf16 roundings of the exact result, with no drift on average."""
    from byzantium.kernels import cpu, reference
    q, k_cache, v_cache, cu, lengths, tables = prefill_case(new_tokens, cached, num_heads, num_kv_heads, head_dim,
                                                            block_size, seed=sum(new_tokens) + 7)
    q16, k16, v16 = q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16()
    scale = head_dim ** -0.5
    got = ext.paged_prefill_attention(q16, k16, v16, cu, lengths, tables, scale)
    assert got.dtype == torch.bfloat16 and torch.isfinite(got.float()).all()
    want = reference.append_prefill_attention(q16.float(), k16.float(), v16.float(), cu, lengths, tables, scale)
    torch.testing.assert_close(got.float(), want, rtol=8e-3, atol=1.2e-2)  # the output's rounding and the weights'
    assert (got.float() - want).abs().mean() < 1.5e-3  # measured 5-8e-4: no error that builds up
    fp32_path = ext.paged_prefill_attention(q16.float(), k16, v16, cu, lengths, tables, scale)
    assert (got.float() - fp32_path).abs().mean() < 1.5e-3
    # A row's output does not depend on the other sequences in the call, and the engine's CPU attention
    # takes this path for a bf16 model's prompt (short appends go row by row, as in fp32).
    first = int(cu[1])
    alone = ext.paged_prefill_attention(q16[:first], k16, v16, cu[:2], lengths[:1], tables[:1], scale)
    assert torch.equal(alone, got[:first])
    assert torch.equal(cpu.append_prefill_attention(q16[:first], k16, v16, cu[:2], lengths[:1], tables[:1], scale), alone)


def test_prefill_without_the_kernel_goes_to_the_reference(monkeypatch):
    from byzantium.kernels import cpu, reference
    q, k_cache, v_cache, cu, lengths, tables = prefill_case([40, 2], [0, 7], 9, 3, 64, 16, seed=5)
    spy = type("Spy", (), {"decode_supported": staticmethod(ext.decode_supported),
                           "prefill_supported": staticmethod(lambda head_dim: False),  # an AVX2-only CPU
                           "avx512_supported": staticmethod(lambda: False),
                           "paged_prefill_attention": staticmethod(lambda *a, **kw: pytest.fail("no kernel here")),
                           "paged_decode_attention": staticmethod(ext.paged_decode_attention)})
    monkeypatch.setattr(cpu.cpu_ext, "load", lambda: spy)
    monkeypatch.setattr(cpu, "row_limit", lambda *shape: 4)
    got = cpu.append_prefill_attention(q, k_cache, v_cache, cu, lengths, tables, 0.125)
    torch.testing.assert_close(got, reference.append_prefill_attention(q, k_cache, v_cache, cu, lengths, tables, 0.125),
                               rtol=1e-5, atol=1e-5)


def test_row_limit_is_measured_once_per_machine_and_head_shape(tmp_path, monkeypatch):
    import json

    from byzantium.kernels import cpu, linear_choice
    monkeypatch.setenv("BYZANTIUM_CACHE", str(tmp_path))
    monkeypatch.setattr(linear_choice, "noisy", lambda samples: False)  # as on a quiet machine
    cpu.row_limit.cache_clear()
    limit = cpu.row_limit(4, 2, 64, 16)
    assert limit in cpu.ROW_LIMIT_CANDIDATES
    entry = json.loads((tmp_path / "linear_choice.json").read_text())[linear_choice.machine_key()]
    (measured,) = [v for k, v in entry.items() if k.startswith("attention ") and " 4x2x64 " in k]
    assert measured["limit"] == limit and measured["seconds"]
    for new, times in measured["seconds"].items():  # rows won (or tied) at every size up to the limit
        assert int(new) > limit or times["rows"] <= times["tiles"]
    cpu.row_limit.cache_clear()
    monkeypatch.setattr(cpu, "_measure_row_limit", lambda *a: pytest.fail("measured again"))
    assert cpu.row_limit(4, 2, 64, 16) == limit
    # On a busy machine: the fixed fallback, kept (later starts agree with it).
    monkeypatch.undo()
    monkeypatch.setenv("BYZANTIUM_CACHE", str(tmp_path / "busy"))
    monkeypatch.setattr(linear_choice, "noisy", lambda samples: True)
    cpu.row_limit.cache_clear()
    assert cpu.row_limit(4, 2, 64, 16) == cpu.BUSY_ROW_LIMIT
    (kept,) = json.loads((tmp_path / "busy" / "linear_choice.json").read_text())[linear_choice.machine_key()].values()
    assert kept["busy"] and kept["limit"] == cpu.BUSY_ROW_LIMIT
    cpu.row_limit.cache_clear()
    monkeypatch.setattr(linear_choice, "noisy", lambda samples: False)
    monkeypatch.setattr(cpu, "_measure_row_limit", lambda *a: pytest.fail("measured again"))
    assert cpu.row_limit(4, 2, 64, 16) == cpu.BUSY_ROW_LIMIT
    cpu.row_limit.cache_clear()


def test_decode_attention_bad_calls_are_refused():
    from byzantium.kernels import cpu
    q, k_cache, v_cache, lengths, tables = paged_case(2, 4, 2, 64, 16, 20, seed=1)
    with pytest.raises(RuntimeError, match="seq_lens out of range"):
        ext.paged_decode_attention(q, k_cache, v_cache, torch.tensor([20, 33], dtype=torch.int32), tables, 0.1)
    with pytest.raises(RuntimeError, match="seq_lens out of range"):
        ext.paged_decode_attention(q, k_cache, v_cache, torch.tensor([0, 3], dtype=torch.int32), tables, 0.1)
    with pytest.raises(RuntimeError, match="fp32"):
        ext.paged_decode_attention(q.double(), k_cache.double(), v_cache.double(), lengths, tables, 0.1)
    assert not ext.decode_supported(48)
    # What the kernel does not cover (a head size, a dtype) is refused: the backend chooser gave such a
    # model the torch backend before it ran (test_attention_backend.py), so no call falls back here.
    q48, k48, v48, lengths48, tables48 = paged_case(2, 4, 2, 48, 16, 20, seed=2)
    with pytest.raises(ValueError, match="head size 48"):
        cpu.paged_decode_attention(q48, k48, v48, lengths48, tables48, 0.2)
    with pytest.raises(ValueError, match="float64"):
        cpu.paged_decode_attention(q.double(), k_cache.double(), v_cache.double(), lengths, tables, 0.1)


def test_engine_decodes_with_it_and_matches_the_torch_backend(tiny_llama, monkeypatch):
    from byzantium import Engine, SamplingParams
    from byzantium.kernels import cpu
    engine = Engine(tiny_llama[1], num_blocks=64)
    torch_backend = Engine(tiny_llama[1], num_blocks=64, attention_backend="torch")
    assert engine.runner.ops is cpu
    calls = []
    real = ext.paged_decode_attention
    monkeypatch.setattr(cpu.cpu_ext, "load", lambda: type("Spy", (), {
        "decode_supported": staticmethod(ext.decode_supported), "store_kv": staticmethod(ext.store_kv),
        "argmax_rows": staticmethod(ext.argmax_rows), "prefill_supported": staticmethod(ext.prefill_supported), "avx512_supported": staticmethod(ext.avx512_supported),
        "paged_prefill_attention": staticmethod(ext.paged_prefill_attention),
        "paged_decode_attention": staticmethod(
            lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))}))
    prompts = [list(range(3, 3 + n)) for n in (4, 17, 40, 9)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    got = [o.token_ids for o in engine.generate(prompts, params)]
    # Every decode step of the four sequences went through the kernel (short prefills may too, row by row).
    assert calls.count(len(prompts)) >= params.max_tokens - 1
    assert got == [o.token_ids for o in torch_backend.generate(prompts, params)]


def test_ninja_from_the_dependency_is_found_without_an_activated_environment(monkeypatch, tmp_path):
    import shutil
    ninja = pytest.importorskip("ninja")
    (tmp_path / "c++").symlink_to(shutil.which("c++"))
    monkeypatch.setenv("PATH", str(tmp_path))  # a compiler but no ninja on PATH
    assert shutil.which("ninja") is None
    assert cpu_ext.supported()
    assert shutil.which("ninja").startswith(ninja.BIN_DIR)


@pytest.mark.parametrize("rows, hidden", [(1, 576), (7, 64), (300, 576), (5, 20)])
def test_fused_rms_norm_matches_the_torch_formula(rows, hidden):
    from byzantium.engine.layers.norm import RMSNorm
    g = torch.Generator().manual_seed(rows + hidden)
    norm = RMSNorm(hidden, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=g))
    wide = torch.randn(rows, hidden + 7, generator=g) * 3
    x = wide[:, 3:3 + hidden]  # rows with a stride, as a slice of a wider tensor
    want = norm(x)
    got = ext.rms_norm(x, norm.weight.detach(), norm.eps)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(ext.rms_norm(x[rows // 2:], norm.weight.detach(), norm.eps), got[rows // 2:])  # row by row


@pytest.mark.parametrize("rows, hidden", [(1, 576), (300, 576), (5, 20)])
def test_fused_add_rms_norm_adds_as_torch_and_norms_the_sum(rows, hidden):
    from byzantium.engine.layers.norm import RMSNorm
    g = torch.Generator().manual_seed(rows * hidden)
    norm = RMSNorm(hidden, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=g))
    x = torch.randn(rows, hidden + 3, generator=g)[:, 1:1 + hidden]  # strided rows
    residual = torch.randn(rows, hidden, generator=g) * 4
    want_out, want_sum = norm.add_forward(x, residual)  # the torch formula (no cpu_ops)
    out, total = ext.add_rms_norm(x, residual, norm.weight.detach(), norm.eps)
    assert torch.equal(total, want_sum)  # the residual stream itself is bit-exact
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)
    assert torch.equal(out, ext.rms_norm(total, norm.weight.detach(), norm.eps))
    assert norm.add_forward(x, None)[1] is x  # the first layer: nothing to add


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_matches_the_reference(dtype):
    from byzantium.kernels import cpu, reference
    g = torch.Generator().manual_seed(3)
    blocks, block_size, kv_heads, head_dim, tokens = 6, 4, 3, 8, 9
    qkv = torch.randn(tokens, (5 + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    k = qkv[:, 5 * head_dim:(5 + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)  # strided views
    v = qkv[:, (5 + kv_heads) * head_dim:].view(tokens, kv_heads, head_dim)
    slots = torch.tensor([0, 5, -1, 23, 7, 8, -1, 12, 1])
    caches = [torch.zeros(2, blocks, block_size, kv_heads, head_dim, dtype=dtype) for _ in range(2)]
    cpu.store_kv(k, v, caches[0][0], caches[0][1], slots)
    reference.store_kv(k, v, caches[1][0], caches[1][1], slots)
    assert torch.equal(caches[0], caches[1]) and caches[0].abs().sum() > 0
    with pytest.raises(RuntimeError, match="outside the cache"):
        ext.store_kv(k, v, caches[0][0], caches[0][1], torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 24]))


@pytest.mark.parametrize("rows, inner", [(1, 1536), (9, 24), (130, 1536), (3, 13)])
def test_fused_silu_mul_matches_torch(rows, inner):
    g = torch.Generator().manual_seed(rows * inner)
    gate_up = torch.randn(rows, 2 * inner, generator=g) * 6
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # far tails and zero
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(ext.silu_mul(gate_up), F.silu(gate) * up, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("tokens, heads, head_dim", [(1, 12, 64), (40, 5, 64), (6, 3, 20), (17, 2, 128)])
def test_fused_rope_matches_apply_rope_on_a_slice_of_qkv(tokens, heads, head_dim):
    from byzantium.engine.layers.rotary import apply_rope
    g = torch.Generator().manual_seed(tokens * heads + head_dim)
    qkv = torch.randn(tokens, (heads + 2) * head_dim, generator=g)
    x = qkv[:, :heads * head_dim].view(tokens, heads, head_dim)  # row stride of the whole qkv row
    angles = torch.rand(tokens, 1, head_dim // 2, generator=g) * 100
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1)
    signed_sin = torch.cat((-angles.sin(), angles.sin()), dim=-1)
    got = ext.rope(x, cos, signed_sin)
    assert got.is_contiguous()
    torch.testing.assert_close(got, apply_rope(x, cos, signed_sin), rtol=1e-6, atol=1e-6)


def test_engine_runs_the_fused_layer_ops_and_matches_torch(tiny_llama):
    from byzantium import Engine, SamplingParams
    from byzantium.engine.layers.norm import RMSNorm
    fused = Engine(tiny_llama[1], num_blocks=64)
    plain = Engine(tiny_llama[1], num_blocks=64)
    assert fused.describe()["cpu_layer_ops"] is True  # on by default where the kernels load
    assert all(m.cpu_ops is not None for m in fused.model.modules() if isinstance(m, RMSNorm))
    plain.model.use_cpu_ops(None)
    prompts = [list(range(3, 3 + n)) for n in (4, 17, 40)]
    params = SamplingParams(max_tokens=10, ignore_eos=True, logprobs=1)
    got, want = fused.generate(prompts, params), plain.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for a, b in zip(got, want):
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.keys() == y.keys() and all(abs(x[t] - y[t]) < 1e-4 for t in x)
