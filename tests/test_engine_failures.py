"""Failure isolation: a forward pass that raises fails only the requests whose rows raise; cancelled
requests are aborted; out of memory retries the step smaller; nothing leaks (blocks, prefix-cache hashes)."""
import asyncio
import time

import pytest
import torch

from byzantium import AsyncEngine, Engine, SamplingParams
from byzantium.engine.failures import out_of_memory
from byzantium.engine.sequence import Status
from conftest import random_prompts

MARK = 255  # a token no random prompt holds (they draw from 1..249): the rows that carry it raise
CPU_OOM = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1024 bytes. Error code 12 (Cannot allocate memory)"


class Faulty:
    """Wraps the engine's model: forward raises `error(input_ids)` when that is not None."""

    def __init__(self, model, error, delay=0.0):
        self.model, self.error, self.delay, self.calls = model, error, delay, []

    def __call__(self, input_ids, positions, meta, kv_cache):
        self.calls.append(input_ids.numel())
        time.sleep(self.delay)
        error = self.error(input_ids)
        if error is not None:
            raise error
        return self.model(input_ids, positions, meta, kv_cache)

    def compute_logits(self, hidden):
        return self.model.compute_logits(hidden)


def inject(engine, error, delay=0.0):
    engine.runner.model = Faulty(engine.runner.model, error, delay)
    return engine.runner.model


def marked(input_ids):
    return RuntimeError("injected fault") if bool((input_ids == MARK).any()) else None


def assert_clean(engine):
    """Every block free again, and no prefix-cache entry holds a failed request's tokens."""
    bm = engine.block_manager
    assert bm.num_free == engine.num_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert all(MARK not in bm.tokens[block] for block in bm.hash_to_block.values())


def test_a_failing_request_fails_alone_in_a_batch_of_32(tiny_llama):
    _, path = tiny_llama
    prefix = random_prompts([32], seed=40)[0]  # two full blocks shared by every prompt
    tails = random_prompts([3 + i % 7 for i in range(31)], seed=41)
    prompts = [prefix + t for t in tails]
    poisoned = prefix + [MARK] * 16 + [5]  # its third block is full: hashed when scheduled
    params = SamplingParams(max_tokens=8)
    want = Engine(path, num_blocks=256).generate(prompts + [prompts[0][:-1] + [7]], params)

    engine = AsyncEngine(path, num_blocks=256)
    inject(engine.engine, marked)
    closed = []

    async def agent():  # the poisoned request is a session turn, admitted first: it owns the shared prefix
        session = await engine.open_session(poisoned)
        try:
            await engine.continue_(session, params)
        finally:
            assert session.seq.status is Status.IDLE  # out of the scheduler, not stuck
            await engine.close_session(session)
            closed.append(session.closed)

    async def main():
        results = await asyncio.gather(agent(), *(engine.generate(p, params) for p in prompts),
                                       return_exceptions=True)
        after = await engine.generate(prompts[0][:-1] + [7], params)  # a new request after the failure
        return results, after

    results, after = asyncio.run(main())
    assert isinstance(results[0], RuntimeError) and "injected fault" in str(results[0])
    assert closed == [True]
    # The 31 others read the shared prefix blocks that the failed row was to write: recomputed, not wrong.
    assert [r.token_ids for r in results[1:]] == [o.token_ids for o in want[:31]]
    assert after.token_ids == want[31].token_ids
    assert engine.stats["max_batch_seqs"] >= 31  # they did share steps
    assert_clean(engine.engine)


def test_a_step_that_fails_whole_fails_exactly_its_requests(tiny_llama):
    _, path = tiny_llama
    prompts = random_prompts([11, 23, 17, 30, 9, 26, 14, 20], seed=42)
    params = SamplingParams(max_tokens=6)
    want = Engine(path, num_blocks=64).generate(prompts, params)
    engine = Engine(path, num_blocks=64, max_num_seqs=4)
    broken = [True]
    inject(engine, lambda ids: RuntimeError("device fault") if broken[0] else None)
    seqs = engine.add_requests(prompts, params)
    ended = engine.step()  # every forward pass of this step raises, retries included
    broken[0] = False
    assert [s.seq_id for s in ended] == [s.seq_id for s in seqs[:4]]  # the step held the first four
    assert all(s.finish_reason == "error" and "device fault" in str(s.error) for s in ended)
    assert all(s.status is Status.WAITING for s in seqs[4:])  # the others were not in it: not failed
    while engine.has_work():
        engine.step()
    assert [engine.output(s).token_ids for s in seqs[4:]] == [o.token_ids for o in want[4:]]
    assert_clean(engine)
    # The synchronous helpers raise the error and leave the engine clean for the next call.
    broken[0] = True
    with pytest.raises(RuntimeError, match="device fault"):
        engine.generate(prompts[:2], params)
    broken[0] = False
    assert_clean(engine)
    assert [o.token_ids for o in engine.generate(prompts[:2], params)] == [o.token_ids for o in want[:2]]


def test_cancelling_10_of_32_requests_aborts_them(tiny_llama):
    _, path = tiny_llama
    prompts = random_prompts([8 + i for i in range(32)], seed=43)
    short, long = SamplingParams(max_tokens=6), SamplingParams(max_tokens=400, ignore_eos=True)
    want = Engine(path, num_blocks=256).generate(prompts[10:], short)
    engine = AsyncEngine(path, num_blocks=256)
    faulty = inject(engine.engine, lambda ids: None, delay=0.003)  # 400 steps take over a second

    async def main():
        cancelled = [asyncio.create_task(engine.generate(p, long)) for p in prompts[:5]]  # callers gone
        timed_out = [asyncio.create_task(asyncio.wait_for(engine.generate(p, long), timeout=0.05))
                     for p in prompts[5:10]]
        rest = [asyncio.create_task(engine.generate(p, short)) for p in prompts[10:]]
        while len(engine.step_records.records) < 3:
            await asyncio.sleep(0.001)
        for task in cancelled:
            task.cancel()
        results = await asyncio.gather(*cancelled, *timed_out, *rest, return_exceptions=True)
        while engine.engine.has_work():  # the aborts take effect at the next step
            await asyncio.sleep(0.01)
        return results

    results = asyncio.run(main())
    assert all(isinstance(r, asyncio.CancelledError) for r in results[:5])
    assert all(isinstance(r, asyncio.TimeoutError) for r in results[5:10])
    assert [r.token_ids for r in results[10:]] == [o.token_ids for o in want]
    assert len(faulty.calls) < 200  # the cancelled requests did not run on to 400 tokens
    assert_clean(engine.engine)


def test_close_session_in_any_state(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=64)
    prompt = random_prompts([40], seed=44)[0]
    waiting = engine.open_session(prompt)
    engine.add_request(waiting, SamplingParams(max_tokens=5))
    engine.close_session(waiting)  # queued, never run
    running = engine.open_session(prompt)
    seq = engine.add_request(running, SamplingParams(max_tokens=5))
    engine.step()
    assert seq.status is Status.RUNNING and running.seq.block_table
    engine.close_session(running)  # mid-generation
    idle = engine.open_session(prompt)
    engine.continue_(idle, SamplingParams(max_tokens=3))
    engine.close_session(idle)
    engine.close_session(idle)  # twice is fine
    assert waiting.closed and running.closed and idle.closed
    assert_clean(engine)
    assert not engine.has_work()
    # Async: closing a session whose turn is in flight ends the turn with an error for its caller.
    async_engine = AsyncEngine(path, num_blocks=64)

    async def main():
        session = await async_engine.open_session(prompt)
        turn = asyncio.create_task(async_engine.continue_(session, SamplingParams(max_tokens=300, ignore_eos=True)))
        while not async_engine.step_records.records:
            await asyncio.sleep(0.001)
        await async_engine.close_session(session)
        with pytest.raises(RuntimeError, match="was closed"):
            await turn
        return session

    assert asyncio.run(main()).closed
    assert_clean(async_engine.engine)


def test_out_of_memory_on_a_big_prefill_is_retried_smaller(tiny_llama):
    _, path = tiny_llama
    prompts = random_prompts([50, 45, 40, 150], seed=45)  # 285 tokens in the first step; one of 150 alone
    params = SamplingParams(max_tokens=5)
    want = Engine(path, num_blocks=128).generate(prompts, params)
    engine = Engine(path, num_blocks=128)
    faulty = inject(engine, lambda ids: RuntimeError(CPU_OOM) if ids.numel() > 64 else None)
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert faulty.calls[0] == 285  # the step was tried whole first
    assert engine.describe()["max_batch_tokens"] <= 64  # later steps are scheduled smaller
    calls = len(faulty.calls)
    engine.generate(random_prompts([120], seed=46), params)  # scheduled in chunks under the new budget
    assert max(faulty.calls[calls:]) <= 64
    assert_clean(engine)
    # Any other error at that size is not about memory: the request fails, nothing is retried in chunks.
    other = Engine(path, num_blocks=128)
    inject(other, lambda ids: RuntimeError("kernel bug") if ids.numel() > 64 else None)
    with pytest.raises(RuntimeError, match="kernel bug"):
        other.generate(prompts[3:], params)
    assert_clean(other)


def test_what_counts_as_out_of_memory():
    assert out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert out_of_memory(MemoryError())
    assert out_of_memory(RuntimeError(CPU_OOM))
    try:  # the CPU allocator's own failure
        torch.empty(2 ** 62, dtype=torch.uint8)
    except RuntimeError as error:
        assert out_of_memory(error)
    assert not out_of_memory(RuntimeError("shape '[4, 8]' is invalid for input of size 30"))
    assert not out_of_memory(ValueError("can't allocate memory"))
