"""AsyncEngine: the Engine's operations as awaitables, batched across coroutines.

One background task steps the engine while anything is pending. Before each step it yields to the
event loop, so every coroutine that is ready enqueues its request first (asyncio.gather starts them one
after another), and the step itself runs in a worker thread, so requests keep arriving while the model
runs and join the next step. All changes to the engine's state (queueing requests, closing sessions)
happen on the event-loop thread between steps, never while a step runs.
"""
import asyncio
from concurrent.futures import ThreadPoolExecutor

from .engine import Engine, Outputs
from .sampling import SamplingParams
from .sequence import Session, Status


class AsyncEngine:
    def __init__(self, *args, **kwargs):
        self.engine = Engine(*args, **kwargs)
        self._waiters = {}  # seq_id -> (seq, future)
        self._between_steps = []  # callables to run on the loop thread before the next step
        self._loop_task = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="byzantium-step")
        self._stepping = False

    # the engine's read-only facts, for callers that need them
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def stats(self):
        return self.engine.stats

    @property
    def step_records(self):
        return self.engine.step_records

    def reset_stats(self):
        self.engine.reset_stats()

    def render_chat(self, conversation, untrusted=False, add_generation_prompt=True):
        return self.engine.render_chat(conversation, untrusted, add_generation_prompt)

    # -- the loop -----------------------------------------------------------------------------------
    async def _wait_for(self, seqs):
        loop = asyncio.get_running_loop()
        futures = []
        for seq in seqs:
            future = loop.create_future()
            self._waiters[seq.seq_id] = (seq, future)
            futures.append(future)
            self._between_steps.append(lambda seq=seq: self.engine.submit(seq))
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._run())
        await asyncio.gather(*futures)
        return seqs

    async def _run(self):
        loop = asyncio.get_running_loop()
        while self._waiters or self._between_steps:
            await asyncio.sleep(0)  # let every ready coroutine enqueue its request first
            for action in self._between_steps:
                action()
            self._between_steps.clear()
            try:
                self._stepping = True
                finished = await loop.run_in_executor(self._executor, self.engine.step)
            except Exception as error:  # fail every waiter rather than hang them
                for seq, future in self._waiters.values():
                    if not future.done():
                        future.set_exception(error)
                self._waiters.clear()
                return
            finally:
                self._stepping = False
            for seq in finished:
                _, future = self._waiters.pop(seq.seq_id)
                if not future.done():
                    future.set_result(seq)

    # -- operations ---------------------------------------------------------------------------------
    async def generate(self, prompts, params=None):
        prompts = Engine._prompt_list(prompts)
        seqs = [self.engine.make_request(p, sp)
                for p, sp in zip(prompts, self.engine._params_list(params, len(prompts)))]
        await self._wait_for(seqs)
        return Outputs(self.engine.output(s) for s in seqs)

    async def chat(self, conversations, params=None, untrusted=False):
        conversations = Engine._conversation_list(conversations)
        return await self.generate([self.engine.render_chat(c, untrusted) for c in conversations], params)

    async def logits(self, prompts):
        import torch
        seqs = [self.engine._logits_seq(p) for p in Engine._prompt_list(prompts)]
        await self._wait_for(seqs)
        return torch.stack([s.logits for s in seqs])

    async def score(self, prompts, candidates):
        prompts = Engine._prompt_list(prompts)
        per_prompt = Engine.candidate_lists(prompts, candidates)
        return self.engine.logprobs_of(await self.logits(prompts), per_prompt)

    async def open_session(self, prompt):
        return self.engine.open_session(prompt)

    async def extend(self, session, tokens_or_text):
        # An idle session is not touched by a running step, so appending tokens here is safe.
        return self.engine.extend(session, tokens_or_text)

    async def continue_(self, sessions, params=None):
        sessions = [sessions] if isinstance(sessions, Session) else list(sessions)
        seqs = [self.engine.make_turn(s, p) for s, p in zip(sessions, self.engine._params_list(params, len(sessions)))]
        await self._wait_for(seqs)
        return Outputs(self.engine.output(s) for s in seqs)

    async def close_session(self, session):
        if session.seq.status not in (Status.IDLE, Status.CLOSED):
            raise ValueError(f"{session} has a request in flight")
        if self._stepping or self._between_steps:
            done = asyncio.get_running_loop().create_future()
            self._between_steps.append(lambda: (self.engine.close_session(session), done.set_result(None)))
            if self._loop_task is None or self._loop_task.done():
                self._loop_task = asyncio.create_task(self._run())
            await done
        else:
            self.engine.close_session(session)

    def shutdown(self):
        self._executor.shutdown(wait=False)


__all__ = ["AsyncEngine", "SamplingParams"]
