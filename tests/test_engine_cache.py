"""Prefix sharing, sessions with append prefill, and preemption under a small block pool."""
import torch

from byzantium import Engine, SamplingParams
from byzantium.engine.kv_cache import BlockManager
from byzantium.engine.sequence import Sequence
from conftest import random_prompts


def test_shared_prefix_is_served_from_cache(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=128)
    prefix = random_prompts([200], seed=5)[0]
    a, b = prefix + [7, 8, 9], prefix + [10, 11]
    params = SamplingParams(max_tokens=4)
    first = engine.generate([a], params)[0]
    second = engine.generate([b], params)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens >= 192
    assert engine.stats["cached_tokens"] >= 192
    # The cached path gives the same tokens as computing everything afresh.
    fresh = Engine(path, num_blocks=128).generate([b], params)[0]
    assert second.token_ids == fresh.token_ids


def test_shared_prefix_in_one_call_and_fully_cached_prompt(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=128)
    prefix = random_prompts([200], seed=6)[0]
    outs = engine.generate([prefix + [1], prefix + [2]], SamplingParams(max_tokens=3))
    assert outs[1].num_cached_tokens >= 192  # blocks stored earlier in the same forward pass are reused
    again = engine.generate([prefix + [1]], SamplingParams(max_tokens=3))[0]  # entirely cached prompt
    assert again.num_cached_tokens == 192 and again.token_ids == outs[0].token_ids


def test_session_extend_prefills_only_new_tokens(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=64)
    prompt, extra = random_prompts([37, 29], seed=7)
    session = engine.open_session(prompt)
    first = engine.continue_([session], SamplingParams(max_tokens=5))[0]
    assert session.token_ids == prompt + first.token_ids
    engine.reset_stats()
    engine.extend(session, extra)
    logits = engine.logits([session])[0]
    # Only the new tokens (and the last generated token, whose K/V was not stored yet) were prefilled.
    assert engine.stats["prefill_tokens"] == len(extra) + 1
    full = prompt + first.token_ids + extra
    fresh = Engine(path, num_blocks=64).logits([full])[0]
    torch.testing.assert_close(logits, fresh, atol=1e-4, rtol=1e-4)
    # Continuing after the logits call generates what a fresh request over the full text generates.
    cont = engine.continue_(session, SamplingParams(max_tokens=6))[0]
    ref = Engine(path, num_blocks=64).generate([full], SamplingParams(max_tokens=6))[0]
    assert cont.token_ids == ref.token_ids
    engine.close_session(session)
    assert session.closed
    assert engine.block_manager.num_free == engine.num_blocks


def test_sessions_are_never_preempted(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=12, max_batch_tokens=64)
    session = engine.open_session(random_prompts([40], seed=8)[0])
    engine.continue_(session, SamplingParams(max_tokens=2))
    held = list(session.seq.block_table)
    outs = engine.generate(random_prompts([30] * 6, seed=9), SamplingParams(max_tokens=20))
    assert all(o.finish_reason == "length" for o in outs)
    assert session.seq.block_table == held


def test_small_pool_preempts_and_outputs_do_not_change(tiny_llama):
    _, path = tiny_llama
    prompts = random_prompts([20 + 3 * i for i in range(16)], seed=11)
    params = SamplingParams(max_tokens=24)
    big = Engine(path, num_blocks=256).generate(prompts, params)
    small_engine = Engine(path, num_blocks=10)
    small = small_engine.generate(prompts, params)
    assert [o.token_ids for o in small] == [o.token_ids for o in big]
    assert all(len(o.token_ids) == 24 for o in small)
    assert small_engine.stats["preemptions"] > 0


def test_block_manager_ref_counts_and_lru():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = Sequence(0, [1, 2, 3, 4, 5], None)
    bm.allocate(a, 5)
    bm.register_full_blocks(a, 5)
    assert bm.num_free == 1 and len(a.block_hashes) == 2
    b = Sequence(1, [1, 2, 3, 4, 9], None)
    hits, hashes = bm.match_prefix(b.token_ids)
    assert hits == a.block_table[:2]
    bm.acquire_prefix(b, hits, hashes)
    assert [bm.ref_counts[x] for x in hits] == [2, 2]
    bm.release(a)
    assert [bm.ref_counts[x] for x in hits] == [1, 1]
    bm.release(b)
    assert bm.num_free == 4
    # Freed blocks keep their content until reused: the prefix still hits.
    assert bm.match_prefix([1, 2, 3, 4, 0])[0] == hits
    # The unhashed block is handed out first, then the least recently freed hashed one.
    c = Sequence(2, [7] * 8, None)
    bm.allocate(c, 4)
    assert set(c.block_table) == {2, 3}  # the hashed blocks 0 and 1 survive
    bm.allocate(c, 8)
    assert bm.match_prefix([1, 2, 3, 4, 0])[0] == []  # evicted once reused
    # A hash collision in the table is confirmed by token ids, never trusted blindly.
    bm2 = BlockManager(num_blocks=2, block_size=2)
    d = Sequence(3, [5, 6, 7], None)
    bm2.allocate(d, 3)
    bm2.register_full_blocks(d, 3)
    bm2.tokens[d.block_table[0]] = (0, 0)
    assert bm2.match_prefix([5, 6, 7])[0] == []
