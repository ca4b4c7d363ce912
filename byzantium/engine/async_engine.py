"""AsyncEngine: the Engine's operations as awaitables, batched across coroutines.

One background task steps the engine while anything is pending. Before each step it yields to the
event loop, so every coroutine that is ready enqueues its request first (asyncio.gather starts them one
after another), and the step itself runs in a worker thread, so requests keep arriving while the model
runs and join the next step. The engine is only touched on the event-loop thread between steps: a
coroutine that arrives while a step runs waits for its end; an abort or a close asked for meanwhile
runs right after it.

Failures stay with their requests: a request whose forward pass failed raises its error in its caller
(the engine goes on with everyone else); a caller that is cancelled (a timeout, a client gone) has its
requests aborted and their blocks freed.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from .engine import Engine
from .sampling import SamplingParams
from .sequence import Sequence, Session
from .sync_api import (Candidate, Conversation, Outputs, Params, Prompt, Prompts, RequestOutput, candidate_lists,
                       prompt_list)

if TYPE_CHECKING:
    import torch

    from .stats import EngineStats

logger = logging.getLogger("byzantium")


class AsyncEngine:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Engine(*args, **kwargs), built on the step thread."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="byzantium-step")
        # Built on the thread that runs the steps: the CPU kernels' OpenMP threads then form one team. A
        # second team (from parallel work on another thread: loading, packing, timing the kernels) makes
        # libgomp count more threads than cores and stop spinning at its barriers, and every parallel
        # region of a step then waits for a futex wake-up, which slows every decode step. What
        # this class computes on the event loop's thread (logits, log-softmax) is numpy, single-threaded.
        self.engine = self._executor.submit(Engine, *args, **kwargs).result()
        self._waiters: dict[int, tuple[Sequence, asyncio.Future[Sequence]]] = {}  # the requests in flight by seq_id
        self._after_step: list[Callable[[], object]] = []  # engine calls asked for while a step runs: made right after it
        self._step_ended: list[asyncio.Future[None]] = []  # coroutines waiting for the running step to end
        self._streams: dict[int, asyncio.Queue[None]] = {}  # seq_id -> a streamed request's queue: told after every step
        self.arriving = 0  # requests waiting for the running step to end before they join the engine
        self._loop_task: asyncio.Task[None] | None = None
        self._stepping = False

    # the engine's read-only facts, for callers that need them
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def stats(self) -> dict[str, Any]:
        return self.engine.stats

    @property
    def step_records(self) -> EngineStats:
        return self.engine.step_records

    def reset_stats(self) -> None:
        self.engine.reset_stats()

    def describe(self) -> dict[str, Any]:
        return self.engine.describe()

    @property
    def profile(self) -> bool:
        return self.engine.profile

    @profile.setter
    def profile(self, on: bool) -> None:
        self.engine.profile = on  # read by the next step

    def render_chat(self, conversation: Conversation, untrusted: bool = False,
                    add_generation_prompt: bool = True) -> list[int]:
        return self.engine.render_chat(conversation, untrusted, add_generation_prompt)

    # -- the loop -----------------------------------------------------------------------------------
    async def _between_steps(self) -> None:
        """Return when no step runs (then the engine may be touched until the next await)."""
        while self._stepping:
            ended = asyncio.get_running_loop().create_future()
            self._step_ended.append(ended)
            await ended

    @property
    def num_waiting(self) -> int:
        """Requests not running yet: queued in the scheduler, or arrived during the running step."""
        return len(self.engine.scheduler.waiting) + self.arriving

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    def _now_or_after_step(self, action: Callable[[], object]) -> None:
        if self._stepping:
            self._after_step.append(action)
        else:
            action()

    async def _add(self, add: Callable[[], list[Sequence]]
                   ) -> tuple[list[Sequence], list[asyncio.Future[Sequence]]]:
        """add() queues requests on the engine (between steps); returns their sequences and futures."""
        self.arriving += 1
        try:
            await self._between_steps()
        finally:
            self.arriving -= 1
        seqs = add()
        loop = asyncio.get_running_loop()
        futures = []
        for seq in seqs:
            futures.append(loop.create_future())
            self._waiters[seq.seq_id] = (seq, futures[-1])
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._run())
        return seqs, futures

    async def _run_requests(self, add: Callable[[], list[Sequence]]) -> list[Sequence]:
        """add() queues requests on the engine; wait until they end and return their sequences."""
        seqs, futures = await self._add(add)
        try:
            await asyncio.gather(*futures)
        except BaseException:  # cancelled, or one of them failed: the others are of no use to anyone
            for seq in seqs:
                self._waiters.pop(seq.seq_id, None)
            def abort_all() -> None:
                for seq in seqs:
                    self.engine.abort(seq)

            self._now_or_after_step(abort_all)
            raise
        return seqs

    def _end_step(self) -> None:
        """After a step: the aborts and closes that waited for it, then whoever waited for its end."""
        self._stepping = False
        actions, self._after_step = self._after_step, []
        for action in actions:
            try:
                action()
            except Exception:  # noqa: BLE001 - an abort or close must not stop the loop
                logger.exception("byzantium: an abort or close after a step failed")
        waiting, self._step_ended = self._step_ended, []
        for future in waiting:
            if not future.done():
                future.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0)  # let every ready coroutine enqueue its request first
            if not self.engine.has_work():
                break
            self._stepping = True
            step = loop.run_in_executor(self._executor, self.engine.step)
            try:
                ended = await asyncio.shield(step)  # cancelling this task must not mark the step ended
            except asyncio.CancelledError:
                # Cancelled (the loop is closing) while the step still runs in its thread: the after-step
                # aborts and closes must wait for it, never touch the engine beside it.
                step.add_done_callback(lambda _: self._end_step())
                raise
            except Exception as error:  # noqa: BLE001 - not a failed forward pass (step handles those): a bug
                logger.exception("byzantium: an engine step raised; failing the requests in flight")
                ended = []
                for seq, _ in list(self._waiters.values()):
                    seq.error = error
                    self.engine.abort(seq)
                    ended.append(seq)
            self._end_step()
            for seq in ended:
                _, future = self._waiters.pop(seq.seq_id, (None, None))
                if future is None or future.done():
                    continue
                if seq.error is not None:
                    future.set_exception(seq.error)
                else:
                    future.set_result(seq)
            for queue in self._streams.values():
                queue.put_nowait(None)
        # Nothing left to step: a waiter still here would wait forever (a bug); tell it instead.
        for seq, future in self._waiters.values():
            if not future.done():
                future.set_exception(RuntimeError(f"request {seq.seq_id} is not in the engine ({seq.status.name})"))
        self._waiters.clear()
        for queue in self._streams.values():
            queue.put_nowait(None)

    # -- operations ---------------------------------------------------------------------------------
    async def generate(self, prompts: Prompts, params: Params = None, *, tag: str | None = None) -> Outputs:
        seqs = await self._run_requests(lambda: self.engine.add_requests(prompts, params, tag=tag))
        return Outputs(self.engine.output(s) for s in seqs)

    async def stream(self, prompt: Prompt, params: SamplingParams | None = None, *,
                     tag: str | None = None) -> AsyncIterator[Sequence]:
        """One request, as it goes: yields its Sequence after every step (read `seq.output_ids`; tokens may
        not have changed) and once more when it ended (`seq.finish_reason` set; then `output(seq)`).
        A failed request raises its error here. Leaving the loop early (a client gone, a cancelled task)
        aborts the request and frees its blocks."""
        (seq,), (future,) = await self._add(lambda: [self.engine.add_request(prompt, params, tag=tag)])
        queue = self._streams[seq.seq_id] = asyncio.Queue()
        try:
            while not future.done():
                await queue.get()
                if not future.done():
                    yield seq
            yield future.result()  # raises the request's error
        finally:
            self._streams.pop(seq.seq_id, None)
            if not future.done():
                self._waiters.pop(seq.seq_id, None)
                future.cancel()
                self._now_or_after_step(lambda: self.engine.abort(seq))

    def output(self, seq: Sequence) -> RequestOutput:
        """The RequestOutput of a streamed request's Sequence (text cut before a stop string)."""
        return self.engine.output(seq)

    async def chat(self, conversations: Conversation | list[Conversation], params: Params = None,
                   untrusted: bool = False, *, tag: str | None = None) -> Outputs:
        return await self.generate(self.engine.chat_prompts(conversations, untrusted), params, tag=tag)

    async def logits(self, prompts: Prompts, *, tag: str | None = None) -> torch.Tensor:
        import numpy as np
        import torch
        seqs = await self._run_requests(lambda: self.engine.add_requests(prompts, logits=True, tag=tag))
        # numpy, not torch.stack: no parallel region on the event loop's thread (see __init__)
        return torch.from_numpy(np.stack([cast("torch.Tensor", s.logits).numpy() for s in seqs]))

    async def score(self, prompts: Prompts, candidates: list[Candidate] | list[list[Candidate]], *,
                    tag: str | None = None) -> list[dict[Candidate, float]]:
        prompts = prompt_list(prompts)
        per_prompt = candidate_lists(prompts, candidates)
        return self.engine.logprobs_of(await self.logits(prompts, tag=tag), per_prompt)

    async def open_session(self, prompt: str | list[int], *, tag: str | None = None) -> Session:
        return self.engine.open_session(prompt, tag=tag)

    async def extend(self, session: Session, tokens_or_text: str | list[int]) -> int:
        # An idle session is not touched by a running step, so appending tokens here is safe.
        return self.engine.extend(session, tokens_or_text)

    async def continue_(self, sessions: Session | list[Session], params: Params = None, *,
                        tag: str | None = None) -> Outputs:
        seqs = await self._run_requests(lambda: self.engine.add_requests(sessions, params, tag=tag))
        return Outputs(self.engine.output(s) for s in seqs)

    async def close_session(self, session: Session) -> None:
        """Close a session in any state; a request in flight on it fails with a RuntimeError. While a step
        runs, the close happens right after it (even when this coroutine is cancelled meanwhile)."""
        if not isinstance(session, Session):
            raise TypeError(f"expected a Session, got {type(session).__name__}")

        def close() -> None:
            _, future = self._waiters.pop(session.seq.seq_id, (None, None))
            self.engine.close_session(session)
            if future is not None and not future.done():
                future.set_exception(RuntimeError(f"{session} was closed while a request on it was in flight"))

        self._now_or_after_step(close)
        await self._between_steps()

    def shutdown(self) -> None:
        self._executor.submit(self.engine.close)  # on the thread that ran the steps, after the last one
        self._executor.shutdown(wait=False)


__all__ = ["AsyncEngine", "SamplingParams"]
