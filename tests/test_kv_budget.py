"""A KV budget the user sets and sees (issue 45): `kv_cache_gib` (`--kv-cache-memory`) is reserved when the
engine starts, so resident memory does not climb as blocks are first written; with none given, the CPU
pool is a fixed 2 GiB (capped by what the run can use), its pages taken as written; the size parses with
its unit, and `serve` says at start what each model's pool holds."""
import argparse

import pytest

from byzantium import Engine
from byzantium.engine.kv_cache import allocate_kv_cache

from conftest import random_prompts


def resident_bytes():
    return int(open("/proc/self/statm").read().split()[1]) * 4096  # resident pages


def test_a_reserved_pool_is_resident_at_start_and_zero():
    import torch
    before = resident_bytes()
    cache = allocate_kv_cache(2, 1024, 16, 8, 64, torch.float32, "cpu", reserve=True)  # 128 MiB
    size = cache.numel() * cache.element_size()
    assert resident_bytes() - before > 0.9 * size  # every page written now
    assert cache.eq(0).all()


def test_an_engine_given_a_budget_holds_it_from_the_start(tiny_llama):
    _, path = tiny_llama
    before = resident_bytes()
    engine = Engine(path, kv_cache_gib=0.125, max_model_len=256, max_num_seqs=4096)
    started = resident_bytes()
    held = engine.memory["kv_cache_bytes"]
    assert abs(held - 2**27) <= engine.memory["kv_cache_bytes"] / engine.num_blocks  # 0.125 GiB, in whole blocks
    assert started - before > 0.9 * held
    engine.generate(random_prompts([40] * 8))  # blocks first written now: nothing more to map
    assert resident_bytes() - started < 0.25 * held


def test_without_a_budget_the_cpu_pool_is_two_gib_at_most(tiny_llama):
    from byzantium.engine.memory import DEFAULT_CPU_KV_GIB
    _, path = tiny_llama
    from byzantium.engine.planning import block_bytes, enough_blocks
    engine = Engine(path, max_num_seqs=20_000)  # the run could use more than 2 GiB
    block = block_bytes(engine)
    assert enough_blocks(engine) * block > DEFAULT_CPU_KV_GIB * 2**30
    assert DEFAULT_CPU_KV_GIB * 2**30 - block < engine.memory["kv_cache_bytes"] <= DEFAULT_CPU_KV_GIB * 2**30
    with pytest.raises(ValueError, match="kv_cache_gib"):
        Engine(path, kv_cache_gib=0)


def test_the_flag_parses_sizes_and_reaches_the_engine_options():
    from byzantium.backends import add_model_split_args, parse_memory, split_kwargs
    ap = argparse.ArgumentParser()
    add_model_split_args(ap)
    assert split_kwargs(ap.parse_args(["--kv-cache-memory", "512MiB"])) == {"kv_cache_gib": 0.5}
    assert split_kwargs(ap.parse_args([])) == {}
    assert parse_memory("2GiB") == parse_memory("2") == parse_memory("2 GB") == 2.0
    for bad in ("0", "-1", "lots", "2XB"):
        with pytest.raises(ValueError, match="--kv-cache-memory"):
            parse_memory(bad)


def test_serve_says_what_each_pool_holds(tiny_llama):
    from byzantium.backends import load_llm
    from byzantium.server.app import kv_cache_line
    _, path = tiny_llama
    llm = load_llm(path, kv_cache_gib=0.0625, max_model_len=256)
    try:
        engine = llm.engine.engine
        line = kv_cache_line("tiny", llm)
        size = engine.memory["kv_cache_bytes"] / 2**30  # the budget, or what the run can use where less
        assert size <= 0.0625 and line.startswith(f"tiny: KV cache {size:.2f} GiB reserved")
        assert f"{engine.num_blocks * engine.block_size:,} tokens" in line
    finally:
        llm.close()
