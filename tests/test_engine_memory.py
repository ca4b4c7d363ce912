"""Memory: the CPU KV pool costs resident memory only for the blocks written; Engine.memory reports it."""
import pytest
import torch

from byzantium import Engine
from byzantium.engine.kv_cache import allocate_kv_cache

from conftest import random_prompts


def resident_bytes():
    return int(open("/proc/self/statm").read().split()[1]) * 4096  # resident pages


def test_the_cpu_pool_is_zero_and_untouched_at_start_up():
    before = resident_bytes()
    cache = allocate_kv_cache(4, 4096, 16, 8, 64, torch.float32, "cpu")  # 1 GiB
    grew = resident_bytes() - before
    assert cache.numel() * cache.element_size() == 2**30
    assert grew < 64 * 2**20, f"allocating a 1 GiB pool made {grew / 2**20:.0f} MiB resident"
    cache[1, 0, 7].fill_(3.0)  # writing one block maps a few pages only
    assert resident_bytes() - before < 64 * 2**20
    assert cache[1, 0, 7].eq(3.0).all() and cache[1, 0, 6].eq(0).all() and cache[3, 1, -1].eq(0).all()


def test_an_engine_with_a_large_pool_stays_small_and_exact(tiny_llama):
    model, path = tiny_llama
    before = resident_bytes()
    engine = Engine(path, num_blocks=100_000)  # 100k blocks of this model: about 0.8 GB of KV
    grew = resident_bytes() - before
    memory = engine.memory
    assert memory["kv_cache_bytes"] > 700 * 2**20
    assert grew < memory["kv_cache_bytes"] / 4, f"constructing the engine made {grew / 2**20:.0f} MiB resident"
    assert memory["weights_bytes"] >= sum(p.numel() * 4 for p in model.parameters()) * 0.9
    prompts = random_prompts([5, 17, 33])
    out = engine.generate(prompts)
    with torch.no_grad():
        for prompt, o in zip(prompts, out):
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=len(o.token_ids), do_sample=False)
            assert o.token_ids == ref[0, len(prompt):].tolist()
    assert engine.memory["kv_blocks_used"] == 0


def test_the_default_cpu_pool_is_what_the_run_needs(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, max_num_seqs=4, max_model_len=256)
    assert engine.num_blocks == 4 * 256 // 16  # every sequence at full length, no more


def test_kv_blocks_fit_the_share_and_what_is_free():
    from byzantium.engine.memory import PLANNING_MARGIN, kv_blocks
    gib = 2**30
    # alone on an 80 GiB device: 0.9 * 80 - 16 (weights) - 4 (activations) = 52 GiB of KV
    assert kv_blocks(80 * gib, 0.9, 16 * gib, 4 * gib, 60 * gib, gib) == 52
    # a second engine: its share would allow more than is free now, so what is free decides
    assert kv_blocks(80 * gib, 0.5, 3 * gib, 1 * gib, 10 * gib, gib) == int((9 * gib - PLANNING_MARGIN) // gib)
    assert kv_blocks(80 * gib, 0.1, 16 * gib, 0, 60 * gib, gib) < 0  # does not fit at all


def test_the_graph_pool_adds_to_the_prefill_peak():
    from byzantium.engine.memory import WarmUpPeaks, kv_blocks
    gib = 2**30
    # The decode peak (3 GiB) holds the 2 GiB pool it captured; later prefill steps (4 GiB) run on top of it.
    peaks = WarmUpPeaks(prefill=4 * gib, decode=3 * gib, graph_pool=2 * gib)
    assert peaks.activations == peaks.prefill + peaks.graph_pool
    # An 8 GiB device with 3 GiB of weights: the larger peak alone would leave a block that serving lacks.
    assert kv_blocks(8 * gib, 1.0, 3 * gib, max(peaks.prefill, peaks.decode), 8 * gib, gib) == 1
    assert kv_blocks(8 * gib, 1.0, 3 * gib, peaks.activations, 8 * gib, gib) < 1
    # A decode step above both (the most logits rows, their sorts) still decides.
    assert WarmUpPeaks(prefill=gib, decode=5 * gib, graph_pool=2 * gib).activations == 5 * gib


def test_planning_budgets_the_graph_pool_under_the_prefill_peak(tiny_llama, monkeypatch):
    from byzantium.engine import planning
    from byzantium.engine import warm_up as warming
    from byzantium.engine.memory import WarmUpPeaks, physical_memory
    _, path = tiny_llama
    ram, mib = physical_memory(), 2**20
    weights = Engine(path, max_num_seqs=2, max_model_len=64).memory["weights_bytes"]
    peaks = WarmUpPeaks(prefill=40 * mib, decode=30 * mib, graph_pool=20 * mib)  # as a CUDA warm-up reports
    monkeypatch.setattr(warming, "warm_up", lambda engine: peaks)
    # A share that holds the weights and the larger peak with 10 MiB to spare, not the pool under the prefill.
    with pytest.raises(ValueError, match=r"does not fit .*graph pool 0\.02 GiB"):
        Engine(path, memory_fraction=(weights + 50 * mib) / ram, max_model_len=64)
    roomy = Engine(path, memory_fraction=(weights + 70 * mib) / ram, max_model_len=64, max_num_seqs=10_000)
    assert roomy.activations_bytes == 60 * mib
    expected = 10 * mib / planning.block_bytes(roomy)  # what is left of the share once the pool is under it
    assert abs(roomy.num_blocks - expected) <= 1  # the fraction's float rounding may cost one block


def test_memory_fraction_bounds_weights_and_kv(tiny_llama):
    from byzantium.engine.memory import physical_memory
    model, path = tiny_llama
    ram = physical_memory()
    small = Engine(path, memory_fraction=0.0005, max_model_len=512, max_num_seqs=10_000)
    large = Engine(path, memory_fraction=0.001, max_model_len=512, max_num_seqs=10_000)
    for engine, fraction in ((small, 0.0005), (large, 0.001)):
        m = engine.memory
        assert m["weights_bytes"] + m["kv_cache_bytes"] <= fraction * ram
        assert m["weights_bytes"] + m["kv_cache_bytes"] > 0.9 * fraction * ram  # the share is used, not wasted
        assert engine.stats["steps"] == 0  # the warm-up leaves no trace
    assert large.num_blocks > 1.9 * small.num_blocks
    prompts = random_prompts([9, 30])
    out = small.generate(prompts)
    with torch.no_grad():
        for prompt, o in zip(prompts, out):
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=len(o.token_ids), do_sample=False)
            assert o.token_ids == ref[0, len(prompt):].tolist()


def test_a_model_that_cannot_fit_is_refused(tiny_llama):
    import pytest
    with pytest.raises(ValueError, match="does not fit in memory_fraction"):
        Engine(tiny_llama[1], memory_fraction=1e-9)


def test_two_engines_in_one_pool_respect_their_budgets(tiny_models):
    from byzantium.backends import LLMPool
    from byzantium.engine.memory import physical_memory
    ram, fraction = physical_memory(), 0.002
    llama, qwen3 = tiny_models["llama"][1], tiny_models["qwen3"][1]  # qwen3: twice the KV bytes per token
    with LLMPool("native", memory_fraction=fraction, max_num_seqs=100_000) as pool:
        shares = pool.plan([llama, qwen3])
        assert abs(sum(shares.values()) - fraction) < 1e-9
        engines = [pool.get(llama).engine.engine, pool.get(qwen3).engine.engine]
        used = [e.memory["weights_bytes"] + e.memory["kv_cache_bytes"] for e in engines]
        for engine, share, bytes_ in zip(engines, shares.values(), used):
            assert bytes_ <= share * ram
        assert sum(used) <= fraction * ram and sum(used) > 0.9 * fraction * ram
        tokens = [e.num_blocks * e.block_size for e in engines]
        assert abs(tokens[0] - tokens[1]) <= 0.02 * max(tokens) + 64  # the same tokens each
        try:
            pool.get(tiny_models["qwen2"][1])
        except ValueError as error:
            assert "not in this pool's memory plan" in str(error)
        else:
            raise AssertionError("a model outside the plan was loaded")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_planning_holds_the_warm_up_graph_pool(tiny_models, monkeypatch):
    """On a GPU: the warm-up's decode step captures a graph whose pool keeps allocator segments, and the
    activations planned put that pool under the prefill peak; a serving engine reports its own pool."""
    from byzantium import SamplingParams
    from byzantium.engine import warm_up as warming
    _, path = tiny_models["qwen3"]
    measured, warm_up = [], warming.warm_up
    monkeypatch.setattr(warming, "warm_up", lambda engine: measured.append(warm_up(engine)) or measured[-1])
    engine = Engine(path, device="cuda", dtype="float32", max_num_seqs=16, max_model_len=128)
    (peaks,) = measured
    assert peaks.graph_pool > 0 and peaks.prefill > 0, peaks
    assert engine.activations_bytes == peaks.activations >= peaks.prefill + peaks.graph_pool
    engine.generate(random_prompts([5, 9, 12]), SamplingParams(max_tokens=4))
    assert engine.describe()["cuda_graphs"]["captured"] and engine.memory["graph_pool_bytes"] > 0
