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


def _race_both(row, key, counter):
    """race through the compiled kernel and through its torch formula."""
    import torch

    from byzantium.engine.sampling.cpu import race
    from byzantium.engine.sampling.noise import gumbel_noise, stream
    lo, hi = stream(key, counter)
    return race(row, key, counter), int((row + gumbel_noise(lo, hi, torch.arange(row.numel()))).argmax())


def test_race_follows_the_distribution_and_never_picks_excluded_tokens():
    import torch

    from byzantium.kernels import cpu_ext
    assert cpu_ext.load() is not None  # the kernel side of _race_both
    logits = torch.tensor([float("-inf"), 0.0, float("-inf"), -0.9163, -0.5108, float("-inf"), 0.1, -3.0, 1.2,
                           float("-inf"), 0.3])  # 11 tokens: a tail past the kernel's 8-wide blocks
    probs = torch.softmax(logits.double(), 0)
    kernel, formula = zip(*(_race_both(logits, 7, i) for i in range(20000)))
    assert kernel == formula  # same noise, same winner (their logs round alike but for ~1e-7)
    counts = torch.bincount(torch.tensor(kernel), minlength=11).double()
    assert counts[probs == 0].sum() == 0
    assert ((counts / counts.sum() - probs).abs() / (probs * (1 - probs) / 20000).sqrt().clamp(min=1e-9)).max() < 4.5
    # A large vocabulary, one key, the counter as the only change: frequencies of the best 50 tokens.
    big = torch.randn(49152, generator=torch.Generator().manual_seed(0)) * 2.5
    drawn = torch.bincount(torch.tensor([_race_both(big, 3, i)[0] for i in range(20000)]), minlength=49152).double()
    p = torch.softmax(big.double(), 0)
    top = p.topk(50).indices
    assert ((drawn[top] / 20000 - p[top]).abs() / (p[top] * (1 - p[top]) / 20000).sqrt()).max() < 5
    # Same (key, counter), same token; another key or counter, another stream; one finite logit wins.
    assert _race_both(big, 3, 5) == _race_both(big, 3, 5)
    assert len({_race_both(big, k, 0)[0] for k in range(20)}) > 10
    assert _race_both(torch.tensor([float("-inf"), 2.0, float("-inf")]), 1, 0) == (1, 1)


def test_race_barely_moves_under_rounding_noise():
    """Noise of 1e-6 in every logit (what kernels that round differently leave) almost never changes a
    token: the race moves only when the two best scores are that close. Inverting the CDF moved a
    token whenever the draw fell among tail tokens thinner than the accumulated noise."""
    import torch

    from byzantium.engine.sampling.cpu import race
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(200, 49152, generator=g) * 3 / 0.7  # a flat tail, temperature 0.7
    noisy = rows * (1 + 1e-6 * torch.randn(rows.shape, generator=g))
    moved = sum(race(a, 9, i) != race(b, 9, i) for i, (a, b) in enumerate(zip(rows, noisy)))
    assert moved <= 2


def test_a_seeded_transcript_survives_kernels_that_round_differently(smollm2_dir, monkeypatch):
    """Seeded transcripts of a resilience system (three questions, three agents, temperature 0.7) are the
    same with the fused CPU layer ops on or off and with either attention path for short appends (what a
    kernel chosen on another machine changes): their logits differ by ~1e-5, which moves a race only at a
    near-tie. (Inverting the CDF, a draw that fell among tail tokens moved: on one of these questions the
    four runs gave four different transcripts.)"""
    import asyncio

    from byzantium.backends import load_llm
    from byzantium.kernels import cpu, cpu_ext
    from byzantium.protocols.resilience import build_system, run_system
    from byzantium.tasks import get_task
    tasks = get_task("gen-arith", 3, seed=3)
    transcripts = []
    for fused, row_limit in ((True, None), (False, None), (True, 0), (False, 0)):
        llm = load_llm(smollm2_dir, backend="native", num_blocks=1024)
        llm.engine.engine.model.use_cpu_ops(cpu_ext.load() if fused else None)
        if row_limit is not None:  # every append through gathered SDPA instead of row by row
            monkeypatch.setattr(cpu, "row_limit", lambda *shape: row_limit)
        async def systems():
            return await asyncio.gather(*(run_system(build_system("self-collab"), task, llm, params=SamplingParams(
                max_tokens=24, temperature=0.7), seed=1) for task in tasks))
        transcripts.append([(m["sender"], m["text"]) for r in asyncio.run(systems()) for m in r["messages"]])
        llm.close()
    assert all(t == transcripts[0] for t in transcripts) and len(transcripts[0]) == 9


def test_compiled_argmax_is_torchs():
    import torch

    from byzantium.kernels import cpu_ext
    ext = cpu_ext.load()
    g = torch.Generator().manual_seed(5)
    for rows, vocab in ((1, 1), (3, 7), (32, 49152), (5, 1003)):
        x = torch.randn(rows, vocab, generator=g)
        x[0, vocab // 2:] = x[0].max()  # ties: the first index wins
        if rows > 2:
            x[1] = float("-inf")
            x[2, vocab - 1] = float("nan")  # a NaN counts as the largest
        assert torch.equal(ext.argmax_rows(x), x.argmax(dim=-1))
