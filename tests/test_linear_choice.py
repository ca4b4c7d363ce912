"""The CPU linear kernels are chosen by timing them here, per shape and phase, cached per machine; a
choice that differs between phases runs a step as two passes and leaves every token batch-independent."""
import json

import pytest
import torch

from byzantium import Engine, SamplingParams
from byzantium.engine.layers.linear import packing_available
from byzantium.kernels import cpu_ext, linear_choice
from conftest import random_prompts

ext = cpu_ext.load()
needs_both = pytest.mark.skipif(ext is None or not packing_available(torch.device("cpu"), torch.float32),
                                reason="needs the compiled CPU kernels and oneDNN packing")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BYZANTIUM_CACHE", str(tmp_path))
    monkeypatch.delenv("BYZANTIUM_LINEAR_KERNELS", raising=False)
    return tmp_path / "linear_choice.json"


@needs_both
def test_each_candidate_is_exact_and_batch_invariant():
    g = torch.Generator().manual_seed(0)
    weight, bias, x = torch.randn(48, 40, generator=g), torch.randn(48, generator=g), torch.randn(9, 40, generator=g)
    want = torch.nn.functional.linear(x, weight, bias)
    for candidate in linear_choice.candidates(ext, True):
        packed = candidate.pack(weight)
        padded = candidate.pad_bias(bias, packed, 48) if isinstance(candidate, linear_choice.Panels) else bias
        torch.testing.assert_close(candidate.run(x, packed, padded, 48), want, rtol=1e-5, atol=1e-5)
        if candidate.name != "torch":  # F.linear may round a row differently with more rows: checked per shape
            assert linear_choice.batch_invariant(candidate, weight, g), candidate.name


@needs_both
def test_choice_is_measured_once_and_cached_per_machine(cache, monkeypatch):
    monkeypatch.setattr(linear_choice, "noisy", lambda samples: False)  # as on a quiet machine
    available = linear_choice.candidates(ext, True)
    weights = {(64, 96): [torch.randn(96, 64) for _ in range(3)], (96, 64): [torch.randn(64, 96)]}
    choices, measured = linear_choice.choose(weights, available)
    assert choices.keys() == weights.keys() and measured.keys() == weights.keys()
    for shape, timings in measured.items():
        assert {"panels", "onednn"} <= timings.keys() <= {"panels", "panels512", "onednn", "torch"}
        # One kernel for both phases (a token's K/V the same whichever pass computed it): the fastest overall.
        best = min(timings, key=lambda c: timings[c]["decode"] + timings[c]["prefill"])
        assert choices[shape] == best
    stored = json.loads(cache.read_text())
    assert list(stored) == [linear_choice.machine_key()]
    monkeypatch.setattr(linear_choice, "time_shape", lambda *a: pytest.fail("measured again"))
    again, measured_again = linear_choice.choose(weights, available)
    assert again == choices and measured_again == {}


@needs_both
def test_a_choice_made_on_a_busy_machine_is_kept_until_measured_again(cache, monkeypatch):
    # The kernels decide the rounding: a process that started on a busy machine must use the kernels a
    # quiet start uses, so the fallback is cached like a measured choice.
    monkeypatch.setattr(linear_choice, "noisy", lambda samples: True)
    available = linear_choice.candidates(ext, True)
    weights = {(32, 48): [torch.randn(48, 32)]}
    tries = []
    timed = linear_choice.time_shape
    monkeypatch.setattr(linear_choice, "time_shape", lambda *a: tries.append(1) or timed(*a))
    choices, measured = linear_choice.choose(weights, available)
    assert measured.keys() == weights.keys() and len(tries) == linear_choice.TRIES
    assert choices == {(32, 48): "panels"}  # the fixed fallback, not the noise's winner
    stored = json.loads(cache.read_text())[linear_choice.machine_key()]
    assert [e["busy"] for e in stored.values()] == [True]
    # A later start, quiet and seeing onednn win, still takes what the cache holds.
    monkeypatch.setattr(linear_choice, "time_shape", lambda *a: pytest.fail("measured again"))
    assert linear_choice.choose(weights, available)[0] == choices
    # BYZANTIUM_LINEAR_KERNELS=measure times it again, once, and replaces the cached choice.
    monkeypatch.setenv("BYZANTIUM_LINEAR_KERNELS", "measure")
    calls = []
    monkeypatch.setattr(linear_choice, "_remeasured", set())
    monkeypatch.setattr(linear_choice, "time_shape", lambda *a: calls.append(1) or (
        {c.name: {"decode": 1.0 if c.name == "onednn" else 2.0, "prefill": 1.0} for c in a[0]}, False))
    assert linear_choice.choose(weights, available)[0] == {(32, 48): "onednn"}
    assert linear_choice.choose(weights, available)[0] == {(32, 48): "onednn"}
    assert calls == [1] and "busy" not in list(json.loads(cache.read_text())[linear_choice.machine_key()].values())[0]


def test_noise_is_a_median_far_above_the_best():
    assert not linear_choice.noisy({"a": [1.0, 1.05, 1.1, 1.2, 3.0], "b": [2.0, 2.1, 2.2, 2.3, 2.4]})
    assert linear_choice.noisy({"a": [1.0, 1.1, 1.6, 1.7, 1.8]})


@needs_both
def test_forced_kernel_and_bad_value(cache, monkeypatch):
    available = linear_choice.candidates(ext, True)
    monkeypatch.setenv("BYZANTIUM_LINEAR_KERNELS", "onednn")
    choices, _ = linear_choice.choose({(8, 8): [torch.randn(8, 8)]}, available)
    assert choices == {(8, 8): "onednn"} and not cache.exists()
    monkeypatch.setenv("BYZANTIUM_LINEAR_KERNELS", "mkl")
    with pytest.raises(ValueError, match="BYZANTIUM_LINEAR_KERNELS='mkl'"):
        linear_choice.choose({(8, 8): [torch.randn(8, 8)]}, available)


@pytest.mark.skipif(not packing_available(torch.device("cpu"), torch.bfloat16), reason="no bf16 oneDNN on this CPU")
def test_bf16_engine_on_the_cpu_uses_bf16_kernels_and_stays_close_to_fp32(tiny_llama):
    path = tiny_llama[1]
    bf16 = Engine(path, num_blocks=128, dtype="bfloat16")
    described = bf16.describe()
    assert set(described["linear_kernels"].values()) <= {"onednn", "torch", "panels_bf16"}
    assert described["attention_backend"] == "cpu" and bf16.kv_cache.dtype == torch.bfloat16
    prompts = random_prompts([5, 30, 17, 44], seed=4)
    want = Engine(path, num_blocks=128).logits(prompts)
    got = bf16.logits(prompts)
    assert got.dtype == torch.float32
    # bf16 keeps ~3 significant digits: the same distribution, not the same bits.
    assert torch.nn.functional.cosine_similarity(got, want, dim=-1).min() > 0.99
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    alone = [bf16.generate([p], params)[0].token_ids for p in prompts]
    assert [o.token_ids for o in bf16.generate(prompts, params)] == alone  # batch-independent in bf16 too
