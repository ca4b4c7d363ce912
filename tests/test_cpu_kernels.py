"""The small-batch CPU linear (kernels/cpu_gemv.cpp) against torch's own linear."""
import pytest
import torch
import torch.nn.functional as F

from byzantium.kernels import cpu_ext

ext = cpu_ext.load() if cpu_ext.supported() else None
pytestmark = pytest.mark.skipif(ext is None, reason="no AVX2 CPU, C++ compiler or ninja: the engine uses oneDNN")


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13, 32])
@pytest.mark.parametrize("k, n", [(64, 128), (576, 960), (37, 5), (1536, 576), (16, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_torch_linear(rows, k, n, bias):
    g = torch.Generator().manual_seed(rows * 1000 + k + n)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    got = ext.small_linear(x, w, b)
    assert got.shape == (rows, n)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5 * k ** 0.5)


def test_non_contiguous_input_and_bad_calls():
    x = torch.randn(8, 64)[::2]  # rows 0, 2, 4, 6: a strided view
    w = torch.randn(32, 64)
    torch.testing.assert_close(ext.small_linear(x, w, None), F.linear(x, w), rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="no rows"):
        ext.small_linear(torch.randn(0, 64), w, None)
    with pytest.raises(RuntimeError, match="fp32"):
        ext.small_linear(torch.randn(1, 64, dtype=torch.float64), w.double(), None)


def test_engine_uses_it_for_small_batches_only(tiny_llama):
    from byzantium import Engine
    from byzantium.engine.models.packed import PackedLinear
    engine = Engine(tiny_llama[1], num_blocks=64)
    layer = engine.model.model.layers[0].mlp.down_proj
    assert isinstance(layer, PackedLinear) and layer.small is ext
    calls = []
    real = ext.small_linear
    layer.small = type("Spy", (), {"small_linear": staticmethod(lambda *a: calls.append(a[0].shape[0]) or real(*a))})
    x = torch.randn(3, layer.in_features)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    layer(torch.randn(9, layer.in_features))  # a prefill-sized batch goes to oneDNN
    assert calls == [3]
    off = Engine(tiny_llama[1], num_blocks=64, cpu_small_batch_kernel=False)
    assert off.model.model.layers[0].mlp.down_proj.small is None



def test_a_model_too_large_for_two_weight_layouts_keeps_one(tiny_llama, monkeypatch):
    from byzantium import Engine, SamplingParams
    from byzantium.engine.models import packed
    prompts = [[5, 6, 7, 8, 9], list(range(10, 40))] * 6  # 12 rows: decode steps above MAX_ROWS too
    params = SamplingParams(max_tokens=6)
    both = Engine(tiny_llama[1], num_blocks=64)
    monkeypatch.setattr(packed, "BOTH_LAYOUTS_BYTES", 0)
    one = Engine(tiny_llama[1], num_blocks=64)
    layer = one.model.model.layers[0].mlp.down_proj
    assert layer.packed is None and layer.weight is not None and layer.small is ext
    assert both.model.model.layers[0].mlp.down_proj.packed is not None
    assert [o.token_ids for o in one.generate(prompts, params)] == [o.token_ids for o in both.generate(prompts, params)]
