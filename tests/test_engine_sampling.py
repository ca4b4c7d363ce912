"""Seeded sampling, stops, logprobs, stats export."""
import json

from byzantium import Engine, SamplingParams
from conftest import random_prompts


def test_seeded_request_is_batch_independent(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=128)
    prompts = random_prompts([12, 30, 7, 19, 25, 3, 40, 16], seed=21)
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=42)
    alone = engine.generate([prompts[0]], params)[0]
    others = [SamplingParams(max_tokens=20, temperature=1.0, seed=s) for s in range(7)]
    batch = engine.generate(prompts, [params] + others)
    assert batch[0].token_ids == alone.token_ids
    again = engine.generate([prompts[0]], SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=42))
    assert again[0].token_ids == alone.token_ids
    different = engine.generate([prompts[0]], SamplingParams(max_tokens=20, temperature=1.0, seed=43))[0]
    assert different.token_ids != alone.token_ids  # the seed matters


def test_stop_token_ids_and_logprobs(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=64)
    prompt = random_prompts([10], seed=22)[0]
    free = engine.generate([prompt], SamplingParams(max_tokens=10, logprobs=3))[0]
    assert len(free.logprobs) == 10 and all(len(lp) >= 3 for lp in free.logprobs)
    assert all(free.token_ids[i] in lp for i, lp in enumerate(free.logprobs))
    stop_at = free.token_ids[4]
    stopped = engine.generate([prompt], SamplingParams(max_tokens=10, stop_token_ids=[stop_at]))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:free.token_ids.index(stop_at) + 1]


def test_stop_string_cuts_text(smollm2_engine):
    params = SamplingParams(max_tokens=30)
    conv = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    full = smollm2_engine.chat(conv, params)[0]
    assert "3" in full.text
    cut = smollm2_engine.chat(conv, SamplingParams(max_tokens=30, stop=["3"]))[0]
    assert cut.finish_reason == "stop" and "3" not in cut.text
    assert full.text.startswith(cut.text)


def test_stats_records_and_exports(tiny_llama, tmp_path):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=64)
    engine.generate(random_prompts([20, 30], seed=23), SamplingParams(max_tokens=5))
    stats = engine.stats
    assert stats["prefill_tokens"] == 50 and stats["decode_tokens"] == 8
    assert stats["steps"] == len(engine.step_records.records) == 5
    assert stats["prefill_seconds"] > 0 and stats["decode_seconds"] > 0
    engine.step_records.to_chrome_trace(tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    steps = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]  # the steps track
    assert len(steps) == 5 and [e["name"] for e in steps] == ["prefill"] + ["decode"] * 4
    assert engine.step_records.to_json(tmp_path / "steps.json")["summary"]["steps"] == 5
    engine.reset_stats()
    assert engine.stats["steps"] == 0


def test_draw_follows_the_distribution_and_never_picks_zero_mass():
    import torch

    from byzantium.engine.sampling import draw, make_generator
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    generator = make_generator(11, "cpu")
    counts = torch.bincount(torch.tensor([draw(probs, generator) for _ in range(20000)]), minlength=6).double()
    assert counts[probs == 0].sum() == 0
    freq = counts / counts.sum()
    assert (freq - probs.double()).abs().max() < 0.015  # ~4 standard errors at 20000 draws
    # The same generator state gives the same token; a one-hot row gives its token.
    a, b = make_generator(5, "cpu"), make_generator(5, "cpu")
    assert [draw(probs, a) for _ in range(50)] == [draw(probs, b) for _ in range(50)]
    assert draw(torch.tensor([0.0, 0.0, 1.0]), a) == 2
