"""The engine's core (add_request / abort / step / output), the one stats record per step with tagged
rows, profiling's split passes, describe() and logged fallbacks."""
import asyncio
import logging

import torch

from byzantium import AsyncEngine, Engine, SamplingParams
from byzantium.engine.sequence import Row, Sequence, Status
from conftest import random_prompts


def spy_records(engine):
    """Every stats.record call of the engine, as a dict of its arguments."""
    calls, real = [], engine._stats.record

    def record(start, seconds, rows, num_seqs, kv_blocks_used, cached_tokens, cache_hits, phase_seconds=None):
        calls.append(dict(rows=[tuple(r[:3]) for r in rows], num_seqs=num_seqs, kv_blocks_used=kv_blocks_used,
                          cached_tokens=cached_tokens, cache_hits=cache_hits, phase_seconds=phase_seconds,
                          requests=[r[3] for r in rows]))
        real(start, seconds, rows, num_seqs, kv_blocks_used, cached_tokens, cache_hits, phase_seconds=phase_seconds)

    engine._stats.record = record
    return calls


def test_row_phases():
    seq = Sequence(0, list(range(10)), None)
    seq.start_turn(None, None)  # a prompt of 10 tokens
    assert Row(seq, 0, 10).phase == "prefill" and Row(seq, 0, 10).ends_sequence
    assert Row(seq, 0, 4).phase == "prefill" and not Row(seq, 0, 4).ends_sequence  # a chunk
    assert Row(seq, 9, 1).phase == "prefill"  # the prompt's last token alone: still the prompt
    seq.token_ids.append(42)  # sampled
    assert Row(seq, 10, 1).phase == "decode"
    assert Row(seq, 0, 11).phase == "prefill"  # recompute after preemption
    seq.token_ids.append(7)  # a session: another agent's token appended by extend
    seq.start_turn(None, None)  # its next turn: what came before is its prompt
    assert Row(seq, 10, 2).phase == "prefill" and Row(seq, 11, 1).phase == "prefill"


def test_core_api_and_one_record_per_step(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=64)
    calls = spy_records(engine)
    prefix = random_prompts([32], seed=50)[0]
    a, b = prefix + [3, 4, 5], prefix + [6]
    params = SamplingParams(max_tokens=3)
    seqs = [engine.add_request(a, params, tag="score"), engine.add_request(b, params)]
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
    assert len(calls) == steps == 3
    # b hit a's prefix blocks, hashed earlier in the same step.
    assert calls[0] == dict(rows=[("score", "prefill", 35), (None, "prefill", 1)], num_seqs=2,
                            kv_blocks_used=4, cached_tokens=32, cache_hits=1, phase_seconds=None,
                            requests=[s.seq_id for s in seqs])  # each row names its request (trace flows)
    assert calls[1]["rows"] == [("score", "decode", 1), (None, "decode", 1)]
    assert calls[-1]["kv_blocks_used"] == 0  # both finished in the last step: blocks back in the pool
    assert [engine.output(s).token_ids for s in seqs] == [o.token_ids for o in engine.generate([a, b], params)]

    # Sessions: the tag given at open_session, unless a request brings its own; a one-token append is prefill.
    calls.clear()
    session = engine.open_session(a, tag="turn")
    engine.continue_(session, SamplingParams(max_tokens=2))
    engine.extend(session, [9])
    engine.logits([session], tag="probe")
    assert [c["rows"] for c in calls] == [[("turn", "prefill", 3)], [("turn", "decode", 1)], [("probe", "prefill", 2)]]
    assert calls[0]["cached_tokens"] == 32 and calls[0]["cache_hits"] == 1
    engine.close_session(session)

    # abort: the request leaves the scheduler and its blocks are free.
    seq = engine.add_request(random_prompts([40], seed=51)[0], SamplingParams(max_tokens=20))
    engine.step()
    engine.step()
    assert seq.status is Status.RUNNING and engine.block_manager.num_used > 0
    engine.abort(seq)
    assert seq.status is Status.FINISHED and seq.finish_reason == "abort"
    assert engine.block_manager.num_used == 0 and not engine.has_work()


def test_async_engine_tags_and_profile_flag(tiny_llama):
    _, path = tiny_llama
    engine = AsyncEngine(path, num_blocks=64)
    calls = spy_records(engine.engine)
    assert engine.profile is False
    engine.profile = True
    assert engine.engine.profile is True

    async def main():
        session = await engine.open_session([1, 2, 3], tag="turn")
        await asyncio.gather(engine.generate([4, 5, 6], SamplingParams(max_tokens=2), tag="refine"),
                             engine.score([[7, 8]], [1, 2], tag="score"),
                             engine.continue_(session, SamplingParams(max_tokens=2)))
        await engine.close_session(session)

    asyncio.run(main())
    tags = {row[0] for call in calls for row in call["rows"]}
    assert {"turn", "refine", "score"} <= tags


def test_profile_runs_prefill_and_decode_as_two_passes_with_the_same_outputs(tiny_llama):
    _, path = tiny_llama
    prompts = random_prompts([45, 70, 5, 33], seed=52)
    params = [SamplingParams(max_tokens=12, ignore_eos=True, logprobs=2)] * 3 + \
             [SamplingParams(max_tokens=12, temperature=1.0, seed=7, logprobs=2)]
    outs = {}
    for profile in (False, True):
        engine = Engine(path, num_blocks=64, max_batch_tokens=16, max_num_seqs=4, profile=profile)
        calls = spy_records(engine)
        passes, run, step = [], engine.runner.run, engine.step  # the phases of each forward pass, per step
        engine.runner.run = lambda rows: passes[-1].append({r.phase for r in rows}) or run(rows)
        engine.step = lambda: passes.append([]) or step()
        outs[profile] = engine.generate(prompts, params)
        assert len(passes) == len(calls)
        mixed = 0
        for call, step_passes in zip(calls, passes):
            phases = {phase for _, phase, _ in call["rows"]}  # (tag, phase, tokens)
            if profile and len(phases) == 2:
                mixed += 1
                assert step_passes == [{"prefill"}, {"decode"}]
                assert call["phase_seconds"].keys() == {"prefill", "decode"} and min(call["phase_seconds"].values()) > 0
            else:
                mixed += len(phases) == 2
                assert step_passes == [phases]
                assert call["phase_seconds"] is None
        assert mixed  # chunked prefills shared steps with decodes
    assert [o.token_ids for o in outs[True]] == [o.token_ids for o in outs[False]]
    for fused, split in zip(outs[False], outs[True]):
        for x, y in zip(fused.logprobs, split.logprobs):
            assert x.keys() == y.keys()
            torch.testing.assert_close(list(x.values()), list(y.values()), atol=1e-5, rtol=1e-5)


def test_describe(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=32, max_num_seqs=8, max_batch_tokens=128, attention_backend="torch")
    d = engine.describe()
    c = engine.config
    per_block = 2 * c.num_hidden_layers * 16 * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    assert d["kv_cache"] == {"num_blocks": 32, "block_size": 16, "bytes": 32 * per_block}
    assert d["attention_backend"] == "torch" and d["dtype"] == "float32" and d["device"] == "cpu"
    assert d["model_code"] == "byzantium.engine.models.llama.LlamaForCausalLM" and d["architecture"] == "LlamaForCausalLM"
    assert d["max_num_seqs"] == 8 and d["max_batch_tokens"] == 128
    assert d["linear_kernels"] == "torch" or set(d["linear_kernels"].values()) <= {  # {"INxOUT": kernel}
        "panels", "panels512", "onednn", "torch"}
    plain = Engine(path, num_blocks=32, cpu_packed_linears=False).describe()
    assert plain["linear_kernels"] == "torch"


def test_fallbacks_are_logged_once_with_the_reason(monkeypatch, caplog):
    from byzantium import kernels
    from byzantium.engine.attention_backend import choose_attention_backend
    from byzantium.kernels import cpu_ext
    kernels.warn_once.cache_clear()
    monkeypatch.setattr(kernels, "importable", lambda name: False)
    with caplog.at_level(logging.WARNING, logger="byzantium"):
        assert choose_attention_backend("auto", torch.device("cuda")).name == "torch"
        assert choose_attention_backend("auto", torch.device("cuda")).name == "torch"
    assert [r.getMessage() for r in caplog.records] == [
        "byzantium: triton is not installed, so attention on CUDA uses the torch reference (much slower; pip install triton)"]
    caplog.clear()
    monkeypatch.setattr(cpu_ext, "load", lambda: None)  # the CPU kernels did not build
    with caplog.at_level(logging.WARNING, logger="byzantium"):
        assert choose_attention_backend("auto", torch.device("cpu")).name == "torch"
    assert len(caplog.records) == 1 and "torch reference" in caplog.records[0].getMessage()
    assert "(" in caplog.records[0].getMessage()  # with the reason
    kernels.warn_once.cache_clear()
    # A build that fails says why.
    monkeypatch.undo()
    monkeypatch.setattr(cpu_ext, "unsupported_reason", lambda: "the CPU has no AVX2 (torch reports DEFAULT)")
    cpu_ext.load.cache_clear()
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="byzantium"):
            assert cpu_ext.load() is None
        assert "no AVX2" in caplog.text
    finally:
        monkeypatch.undo()
        cpu_ext.load.cache_clear()
        kernels.warn_once.cache_clear()


def test_bf16_on_a_cpu_without_bf16_units_is_said_once(tiny_llama, monkeypatch, caplog):
    from byzantium import kernels
    from byzantium.engine import config as engine_config
    _, path = tiny_llama
    for has_units in (True, False):
        kernels.warn_once.cache_clear()
        caplog.clear()
        monkeypatch.setattr(engine_config, "cpu_has_bf16_units", lambda: has_units)
        with caplog.at_level(logging.WARNING, logger="byzantium"):
            Engine(path, num_blocks=16, dtype="bfloat16", cpu_packed_linears=False, attention_backend="torch")
            Engine(path, num_blocks=16, dtype="float32", cpu_packed_linears=False, attention_backend="torch")
        said = [r.getMessage() for r in caplog.records if "no bf16 units" in r.getMessage()]
        assert len(said) == (0 if has_units else 1) and all("dtype='float32'" in m for m in said)
    kernels.warn_once.cache_clear()
    assert engine_config.cpu_has_bf16_units() in (True, False)  # the real probe runs on this torch
