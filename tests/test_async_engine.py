"""AsyncEngine: concurrent coroutines share forward passes."""
import asyncio

import pytest

from byzantium import AsyncEngine, Engine, SamplingParams
from conftest import random_prompts


def test_32_coroutines_are_batched(tiny_llama):
    _, path = tiny_llama
    engine = AsyncEngine(path, num_blocks=256)
    prompts = random_prompts([5 + i for i in range(32)], seed=31)
    params = SamplingParams(max_tokens=8)

    async def main():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    outs = asyncio.run(main())
    assert len(outs) == 32 and all(len(o.token_ids) == 8 for o in outs)
    assert engine.stats["max_batch_seqs"] >= 16
    # Same tokens as the synchronous engine.
    ref = Engine(path, num_blocks=256).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]


def test_async_sessions_score_and_late_arrivals(tiny_llama):
    _, path = tiny_llama
    engine = AsyncEngine(path, num_blocks=128)
    a, b = random_prompts([20, 24], seed=32)

    async def agent(prompt):
        session = await engine.open_session(prompt)
        out = await engine.continue_(session, SamplingParams(max_tokens=4))
        await engine.extend(session, [3, 4, 5])
        out2 = await engine.continue_(session, SamplingParams(max_tokens=4))
        await engine.close_session(session)
        return out.token_ids + out2.token_ids

    async def late():
        await asyncio.sleep(0.01)  # arrives while steps are running
        return await engine.score([a, b], [[1, 2], [3]])

    async def main():
        return await asyncio.gather(agent(a), agent(b), late())

    ra, rb, scores = asyncio.run(main())
    assert len(ra) == len(rb) == 8
    assert set(scores[0]) == {1, 2} and set(scores[1]) == {3}
    assert all(v <= 0 for v in scores[0].values())


def test_errors_reach_the_caller(tiny_llama):
    _, path = tiny_llama
    engine = AsyncEngine(path, num_blocks=64)
    with pytest.raises(ValueError, match="empty prompt"):
        asyncio.run(engine.generate([[]], SamplingParams()))


def test_the_engine_is_built_on_the_step_thread_and_the_loop_runs_no_torch_math(tiny_llama, monkeypatch):
    """One thread does every parallel torch/kernel region (loading, packing, steps): a second OpenMP team
    would make libgomp stop spinning at its barriers and slow every step. The event loop's own work on
    logits (stacking, log-softmax for score) is numpy."""
    import threading

    import torch

    from byzantium.engine import engine as engine_module
    threads = {}
    load, stack, log_softmax = engine_module.Engine._load_model, torch.stack, torch.log_softmax
    monkeypatch.setattr(engine_module.Engine, "_load_model",
                        lambda self, *a: threads.setdefault("load", threading.current_thread().name) and load(self, *a))
    engine = AsyncEngine(tiny_llama[1], num_blocks=64)
    monkeypatch.setattr(torch, "stack", lambda *a, **k: threads.setdefault(
        f"stack {threading.current_thread().name}", True) and stack(*a, **k))
    monkeypatch.setattr(torch, "log_softmax", lambda *a, **k: threads.setdefault(
        f"log_softmax {threading.current_thread().name}", True) and log_softmax(*a, **k))
    prompts = random_prompts([6, 9], seed=40)
    got = asyncio.run(engine.score(prompts, [5, 7]))
    monkeypatch.undo()
    assert threads.pop("load").startswith("byzantium-step")
    assert not [k for k in threads if not k.split()[1].startswith("byzantium-step")], threads
    want = Engine(tiny_llama[1], num_blocks=64).score(prompts, [5, 7])
    assert got == want and all(-30 < v <= 0 for d in got for v in d.values())
    engine.shutdown()


def test_a_loop_cancelled_mid_step_leaves_the_engine_to_the_step(tiny_llama):
    """The stepping task cancelled while a step runs in its thread (the event loop closing): an abort asked
    for during the step runs after the step has ended, never beside it on the engine."""
    import threading
    _, path = tiny_llama
    engine = AsyncEngine(path, num_blocks=64)
    real_step, in_step, events = engine.engine.step, threading.Event(), []

    def slow_step():
        in_step.set()
        events.append("step starts")
        threading.Event().wait(0.3)
        result = real_step()
        events.append("step ends")
        return result

    engine.engine.step = slow_step

    async def main():
        task = asyncio.create_task(engine.generate([[1, 2, 3]], SamplingParams(max_tokens=50)))
        while not in_step.is_set():
            await asyncio.sleep(0.01)
        engine._now_or_after_step(lambda: events.append("abort"))
        engine._loop_task.cancel()
        task.cancel()
        await asyncio.sleep(0.6)  # the step's thread ends meanwhile; its done-callback runs here

    asyncio.run(main())
    assert events[:3] == ["step starts", "step ends", "abort"]
