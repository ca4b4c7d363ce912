"""Engine: the model, the paged KV cache, the block manager, the scheduler, the runner and the stats.

Its core is small: add_request (returns the request's Sequence), abort, step (returns the requests that
ended), output. A step is: schedule, run the forward pass, postprocess. The blocking helpers (generate,
chat, logits, score, sessions: sync_api.py) and AsyncEngine are written on it; postprocess is the one place
a step's results reach the requests. Around it, each part owning its own rules: the settings, resolved and
frozen, handed whole to every part (config.py), the model and its kernels (model_setup.py), the KV pool and
runner of each rank (cache_setup.py, tensor_parallel.py), the warm-up and memory planning (warm_up.py,
planning.py), the scheduler, which owns admission, finishing, preemption and the token budget
(scheduler.py; failure isolation, failures.py, and riders, riders.py, ask it), sampling and the append/stop
loop (sampling/), and speculation (speculation.py)."""
from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from . import prompt_logprobs
from .attention_backend import ModelFeatures, choose_attention_backend
from .cache_setup import build_pool_and_runner
from .config import engine_config, fit_to_model, resolve
from .failures import EngineFailed, discard, fail, forward_isolating, isolate, shrink_budget
from .grammar import Grammars
from .kv_cache import BlockManager, kv_cache_dtype
from .layers import parallel
from .loader import generation_config, load_tokenizer, resolve_model
from .model_setup import ModelSetup, load_model
from .models import model_class
from .planning import StepPeak, default_num_blocks, memory_held
from .riders import give_logits, part_ways
from .sampling import SamplingParams
from .sampling.append import TokenAppender
from .scheduler import Scheduler
from .sequence import Row, Sequence, Session, Status
from .speculation import PromptLookup, StepDrafts
from .stats import EngineStats
from .tensor_parallel import start_ranks
from .warm_up import planned_num_blocks
from .sync_api import Params, Prompt, Prompts, RequestOutput, SyncAPI, check_idle, params_list, prompt_list

__all__ = ["Engine", "RequestOutput"]


class Engine(SyncAPI):
    # set in __init__; build_cache and the warm-up (warm_up.py) replace the pool and what holds it
    device: torch.device
    dtype: torch.dtype
    quantization: Any  # quantization.Fp8Spec, or None
    kv_cache: torch.Tensor
    block_manager: BlockManager
    scheduler: Scheduler
    runner: Any  # runner.ModelRunner

    def __init__(self, model: str | os.PathLike[str] | None = None, **options: Any) -> None:
        """model: a hub id, a directory, a GGUF file, or None (the embedded model); options: EngineConfig's."""
        c = resolve(engine_config(model, options))  # bad options fail here, before anything loads
        self.engine_config, self.device, self.dtype = c, c.device, c.dtype
        self.model_dir = resolve_model(model)  # bad names fail here, before anything heavy
        from transformers import AutoConfig
        checkpoint_config = AutoConfig.from_pretrained(self.model_dir)
        self.model_class = model_class(checkpoint_config)  # unsupported models fail before the weights are read
        self.tokenizer = load_tokenizer(self.model_dir)
        self.peers = None  # the other tensor-parallel ranks (tensor_parallel.py)
        group = parallel.Group(0, c.tensor_parallel_size)
        with parallel.using(group):  # rank 0's slice of the model
            setup = self._load_model(checkpoint_config, self.model_dir)
        if c.tensor_parallel_size > 1:  # after rank 0's load: the others read the kernel choices it cached
            self.peers = start_ranks(group, self.model_dir, c)
        self.model, self.linear_kernels, self.linear_timings = setup.model, setup.linear_kernels, setup.linear_timings
        self.cpu_layer_ops = setup.cpu_layer_ops
        self.quantization = setup.quantization  # quantization.Fp8Spec, or None
        self.config = self.model.config  # the text model's: a multimodal checkpoint's text_config (Gemma 3)
        c = fit_to_model(c, self.model)
        self.kv_cache_dtype = kv_cache_dtype(c.kv_cache_dtype, self.dtype)  # "fp8": e4m3 K/V, read by torch or Triton
        # the one place the attention backend is decided (a request it cannot run fails here, naming why)
        self.attention = choose_attention_backend(c.attention_backend, self.device, self.dtype, self.kv_cache_dtype,
                                                  c.cpu_kernels, ModelFeatures.of(self.model))
        self.engine_config = c = replace(c, attention_backend=self.attention.name)  # resolved: each part gets it whole
        self.eos_token_ids = self._eos_ids()
        self.grammars = Grammars(self.tokenizer, self.config.vocab_size, self.eos_token_ids)  # structured outputs
        self.appender = TokenAppender(self.device, self.eos_token_ids, self.tokenizer, c.max_model_len)
        self.drafter = PromptLookup(c.num_speculative_tokens, c.speculative_max_rows) if c.num_speculative_tokens else None
        self.profile = c.profile  # a step with prefill and decode rows runs them as two timed passes (switchable)
        self._stats = EngineStats()
        self.step_peak = StepPeak(self.device)
        self._ids = itertools.count()
        self.activations_bytes = None  # measured by the warm-up of memory planning (CUDA)
        num_blocks = c.num_blocks
        if num_blocks is None and c.kv_cache_gib is None and (self.device.type == "cuda" or c.memory_fraction):
            num_blocks = planned_num_blocks(self, c.memory_fraction)
        self.build_cache(num_blocks or default_num_blocks(self, c.kv_cache_gib))

    # The resolved config's limits, read where the engine's callers have always read them.
    max_model_len = property(lambda self: self.engine_config.max_model_len)
    block_size = property(lambda self: self.engine_config.block_size)
    max_num_seqs = property(lambda self: self.engine_config.max_num_seqs)
    attention_backend = property(lambda self: self.engine_config.attention_backend)
    enforce_eager = property(lambda self: self.engine_config.enforce_eager)

    def _load_model(self, checkpoint_config: Any, model_dir: Path) -> ModelSetup:
        return load_model(self.model_class, checkpoint_config, model_dir, self.dtype, self.device, self.engine_config)

    def build_cache(self, num_blocks: int) -> None:
        """The KV pool and everything that holds it: block manager, scheduler, runner; on every rank."""
        self.num_blocks = num_blocks
        self.kv_cache = self.runner = None  # the old pool (planning's warm-up) goes before the new one is allocated
        graphs = not self.engine_config.enforce_eager and self.peers is None  # graphs would capture the collectives
        self.kv_cache, self.runner = build_pool_and_runner(self.model, self.engine_config, num_blocks, self.device, graphs)
        self.block_manager = BlockManager(num_blocks, self.block_size)
        self.scheduler = Scheduler(self.block_manager, self.engine_config, self.drafter)
        if self.peers is not None:  # every rank its slice of the same pool, and told every step from now on
            self.peers.tell("build_cache", (self.engine_config, num_blocks))
            self.runner.peers = self.peers

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.config, generation_config(self.model_dir), self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            ids.update(value if isinstance(value, (list, tuple)) else [] if value is None else [value])
        return ids

    def describe(self) -> dict[str, Any]:
        """What this engine runs: model code, kernels, dtype, device, KV pool and batch limits."""
        model_cls = type(self.model)
        return {"model": str(self.model_dir), "architecture": self.model.arch,
                "tensor_parallel_size": self.engine_config.tensor_parallel_size,
                "quantization": None if self.quantization is None else "fp8",  # the only weight format quantized
                "quantization_source": None if self.quantization is None else self.quantization.source,
                "kv_cache_dtype": str(self.kv_cache_dtype).removeprefix("torch."),
                "model_code": f"{model_cls.__module__}.{model_cls.__qualname__}",
                "attention_backend": self.attention.name,
                "attention_backend_reason": self.attention.reason, "linear_kernels": self.linear_kernels,
                "cpu_layer_ops": self.cpu_layer_ops,
                "fused_gate_up_silu": sum(isinstance(getattr(m, "glu", None), tuple) for m in self.model.modules()),
                "dtype": str(self.dtype).removeprefix("torch."), "device": str(self.device),
                "kv_cache": {"num_blocks": self.num_blocks, "block_size": self.block_size,
                             "bytes": self.kv_cache.numel() * self.kv_cache.element_size()},
                "max_num_seqs": self.max_num_seqs, "max_batch_tokens": self.scheduler.max_batch_tokens,
                "max_model_len": self.max_model_len, "profile": self.profile, "cuda_graphs": self.runner.describe(),
                "speculation": self.drafter.describe() if self.drafter is not None else None}

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (an engine on one rank has none)."""
        if self.peers is not None:
            self.peers.close()

    @property
    def memory(self) -> dict[str, Any]:
        return memory_held(self)

    # -- requests -----------------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a prompt: a string (tokenized as raw text, special tokens parsed) or a list of ids."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer files: give prompts as lists of token ids")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("empty prompt: a prompt needs at least one token")
        vocab = self.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        return ids

    def check_fits(self, num_tokens: int, what: str = "prompt") -> None:
        if num_tokens >= self.max_model_len:
            raise ValueError(f"{what} has {num_tokens} tokens; the model's context is {self.max_model_len} "
                             f"tokens and at least one must be left to generate")
        capacity = self.num_blocks * self.block_size
        if num_tokens + 1 > capacity:
            raise ValueError(f"{what} needs {num_tokens + 1} token slots but the KV cache pool holds only "
                             f"{capacity} ({self.num_blocks} blocks of {self.block_size}); raise num_blocks")

    def _check_room(self, total: int, what: str) -> None:
        capacity = self.num_blocks * self.block_size
        if total > capacity:
            raise ValueError(f"{what} can reach {total} tokens but the KV cache pool holds only {capacity} "
                             f"({self.num_blocks} blocks of {self.block_size}); raise num_blocks or lower max_tokens")

    def new_request_id(self) -> int:
        return next(self._ids)

    # -- the core: add requests, abort them, step, read outputs ----------------------------------------
    def add_request(self, prompt: Prompt, params: SamplingParams | None = None, *, logits: bool = False,
                    tag: str | None = None, prompt_logprobs_from: int = 1) -> Sequence:
        """Queue one request and return its Sequence; step() advances it.

        prompt: text (tokenized as raw text, special tokens parsed), token ids, or a Session (the request
        is a turn that continues it). logits=True: one forward pass, the next-token logits in seq.logits,
        no token sampled (params unused). tag labels the request in the stats. With params.prompt_logprobs,
        the prompt's log-probabilities from token prompt_logprobs_from on (prompt_logprobs.py)."""
        asks_prompt = not logits and params is not None and getattr(params, "prompt_logprobs", None) is not None
        if asks_prompt and isinstance(prompt, Session):
            raise ValueError("prompt_logprobs are for plain prompts, not for a session's turns")
        if isinstance(prompt, Session):
            check_idle(prompt)
            seq = prompt.seq
        else:
            ids = self.encode(prompt)
            self.check_fits(len(ids))
            seq = Sequence(self.new_request_id(), ids, None)
        if logits:
            seq.start_turn(None, None, logits_only=True)
            seq.grammar = None
        else:
            params = SamplingParams() if params is None else params
            if not isinstance(params, SamplingParams):
                raise TypeError(f"expected SamplingParams, got {type(params).__name__}")
            what = f"{prompt}" if isinstance(prompt, Session) else "this request"
            self._check_room(min(len(seq) + params.max_tokens, self.max_model_len), what)
            grammar = self.grammars.start(params)  # its structured-output matcher (grammar.py); a bad one fails here
            seq.start_turn(params, self.appender.generator(params), logits_only=params.max_tokens == 0)
            seq.grammar = grammar
            if asks_prompt:
                prompt_logprobs.start(seq, params.prompt_logprobs, prompt_logprobs_from)
        if isinstance(prompt, Session) and seq.num_computed == len(seq):
            # Every token computed (after a logits call): recompute the last one to get its logits again.
            seq.num_computed -= 1
            seq.turn_start = seq.num_computed
        seq.tag = prompt.tag if tag is None and isinstance(prompt, Session) else tag
        self._stats.totals["requests"] += 1
        self.scheduler.add(seq)
        return seq

    def add_requests(self, prompts: Prompts, params: Params = None, *, logits: bool = False, tag: str | None = None,
                     prompt_logprobs_from: list[int] | None = None) -> list[Sequence]:
        """add_request for each prompt (one prompt, or a list; params: one for all, or one per prompt;
        prompt_logprobs_from: None for 1, or one each). All or nothing: when one is invalid, those already
        queued are aborted and the error raised."""
        prompts = prompt_list(prompts)
        each: list[SamplingParams | None] = [None] * len(prompts) if logits else [*params_list(params, len(prompts))]
        firsts = [1] * len(prompts) if prompt_logprobs_from is None else list(prompt_logprobs_from)
        if len(firsts) != len(prompts):
            raise ValueError(f"got {len(firsts)} prompt_logprobs_from for {len(prompts)} prompts")
        seqs = []
        try:
            for prompt, p, first in zip(prompts, each, firsts):
                seqs.append(self.add_request(prompt, p, logits=logits, tag=tag, prompt_logprobs_from=first))
        except BaseException:
            for seq in seqs:
                self.abort(seq)
            raise
        return seqs

    def abort(self, seq: Sequence) -> None:
        """End a request that is queued or running: it leaves the scheduler and frees its blocks (a session
        keeps what it has computed and becomes idle). A request that already ended is left alone."""
        if seq.status in (Status.WAITING, Status.RUNNING):
            seq.finish_reason = "abort"
            self.scheduler.remove(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Sequence]:
        """Schedule, run the forward pass, post-process. Returns the requests that ended in this step:
        finished, or failed (seq.error holds the exception, finish_reason is "error"). Rows whose forward
        pass raises fail alone (failures.py); everything else in the engine goes on. Each step that
        computed anything makes exactly one stats.record call."""
        if not self.scheduler.has_work():
            return []
        start, preempted_before = time.perf_counter(), self.scheduler.num_preemptions
        rows, ended = self._schedule()
        admitted = self.scheduler.pop_admitted()  # (prompt tokens found in the prefix cache, requests with a hit)
        rows, seqs, logits, phase_seconds, failed = self._run(rows)
        self._stats.totals["preemptions"] += self.scheduler.num_preemptions - preempted_before
        finished, rider_rows = self.postprocess(rows, seqs, logits) if rows else ([], [])
        self._record(start, rows, rider_rows, admitted, phase_seconds)
        return ended + failed + finished

    def _schedule(self) -> tuple[list[Row], list[Sequence]]:
        """(the step's rows, []), or ([], every queued request failed) when nothing queued can ever run."""
        try:
            return self.scheduler.schedule(), []
        except RuntimeError as error:  # every block is held by sessions
            return [], fail(self.scheduler, [(seq, error) for seq in [*self.scheduler.running, *self.scheduler.waiting]])

    def _run(self, rows: list[Row]
             ) -> tuple[list[Row], list[Sequence], torch.Tensor | None, dict[str, float] | None, list[Sequence]]:
        """The forward pass of `rows`, failures isolated (failures.py). Returns (the rows computed, their
        sequences, their logits, phase_seconds, the requests that failed)."""
        if not rows:
            return [], [], None, None, []
        self.step_peak.start()
        try:
            seqs, logits, failed, phase_seconds = self._execute(rows)
        except EngineFailed as error:  # nothing can run any more: every request gets the error
            for seq in (ended := self.scheduler.take_all()):
                seq.error, seq.finish_reason = error, "error"
            return [], [], None, None, ended
        except BaseException:  # interrupted (KeyboardInterrupt...): nothing of this step counts
            discard(self.scheduler, rows, [])
            raise
        if not failed:
            return rows, seqs, logits, phase_seconds, []
        rows, seqs, logits, ended = isolate(self.scheduler, rows, seqs, logits, failed)
        return rows, seqs, logits, phase_seconds, ended

    def _execute(self, rows: list[Row]) -> tuple[list[Sequence], torch.Tensor | None,
                                                  dict[int, tuple[Sequence, BaseException]], dict[str, float] | None]:
        """The step's forward pass: one fused pass; with profiling on and both phases present, the prefill
        rows then the decode rows, each timed. Returns (seqs, logits, failed, phase_seconds)."""
        phases = {"prefill": [r for r in rows if r.phase == "prefill"], "decode": [r for r in rows if r.phase == "decode"]}
        timed = self.profile and all(phases.values())
        passes: Iterable[tuple[Any, list[Row]]] = phases.items() if timed else [(None, rows)]  # phase None: untimed
        seqs: list[Sequence] = []
        logits: list[torch.Tensor] = []
        failed: dict[int, tuple[Sequence, BaseException]] = {}
        phase_seconds: dict[str, float] = {}
        for phase, part in passes:
            begin = self._clock() if timed else 0.0
            part_seqs, part_logits, part_failed = forward_isolating(self.runner.run, part, self._out_of_memory)
            if timed:
                phase_seconds[phase] = self._clock() - begin
            seqs += part_seqs
            logits += part_logits
            failed.update(part_failed)
        return seqs, torch.cat(logits) if logits else None, failed, phase_seconds if timed else None

    def _out_of_memory(self, num_tokens: int, error: BaseException) -> None:
        shrink_budget(self.scheduler, self.device, num_tokens, error)

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the GPU's work so far is inside the time read here
        return time.perf_counter()

    def postprocess(self, rows: list[Row], seqs: list[Sequence], logits: torch.Tensor
                    ) -> tuple[list[Sequence], list[tuple[Any, ...]]]:
        """After a forward pass: the rows' tokens are computed; each sequence a row ended (`seqs`, one
        `logits` row each; a speculative step's sequence one per row) gets its logits (a logits request) or
        its next tokens, and may finish; so does each sequence riding on it (scheduler.riding), from the
        same logits. Returns (the requests that finished or failed, the stats rows of riders' tokens)."""
        totals, riding = self._stats.totals, self.scheduler.riding
        last_row = {}
        for row in rows:
            row.seq.num_computed = row.end
            last_row[row.seq.seq_id] = row
        drafts = StepDrafts(rows)
        finished, to_sample, riders = [], [], []
        for seq, index in rows_by_sequence(seqs):
            row, seq_riders = last_row[seq.seq_id], riding.get(seq.seq_id, ())
            if seq.logits_only:
                seq.logits, seq.finish_reason = logits[index[0]].cpu(), "logits"
                finished += [seq] + give_logits(seq, seq_riders, row, totals)
                continue
            to_sample += [(seq, index, drafts.of(seq), True)] + [(r, index, drafts.of(seq), False) for r in seq_riders]
            riders += [(rider, seq, len(rider), row) for rider in seq_riders]
        for seq, _, _, _ in to_sample:
            seq.num_computed = len(seq)  # every token it had is computed now (riders: by their leader's rows)
        sampled, accepted, error = self.appender.append(logits, to_sample)
        failed = fail(self.scheduler, [(seq, error[1]) for seq in error[0]]) if error else []
        totals["accepted_draft_tokens"] += accepted
        totals["draft_tokens"] += drafts.count()
        drafts.mark_wasted()
        finished += sampled
        ended = {id(seq) for seq in finished + failed}
        rider_rows = part_ways(riders, ended, self.scheduler, self.runner.copy_block, totals)
        self.scheduler.finish(finished)
        return finished + failed, rider_rows

    def _record(self, start: float, rows: list[Row], rider_rows: list[tuple[Any, ...]], admitted: tuple[int, int],
                phase_seconds: dict[str, float] | None) -> None:
        self.step_peak.end()
        if not rows:
            return
        cached_tokens, cache_hits = admitted
        step_rows = [(row.seq.tag, row.phase, row.num_tokens, row.seq.seq_id) for row in rows if not row.wasted]
        riders = sum(map(len, self.scheduler.riding.values()))  # served by the step without rows of their own
        self._stats.record(start, time.perf_counter() - start, step_rows + rider_rows,
                           len({r.seq.seq_id for r in rows}) + riders, self.block_manager.num_used,
                           cached_tokens, cache_hits, phase_seconds=phase_seconds)

    def output(self, seq: Sequence) -> RequestOutput:
        ids = seq.output_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""
        if seq.stop_text_at is not None:
            text = text[:seq.stop_text_at]
        cached = seq.turn_start if seq.pinned else (seq.num_cached_tokens or 0)
        reason = "length" if seq.finish_reason == "logits" and seq.params is not None else seq.finish_reason
        return RequestOutput(seq.seq_id, text, list(ids), reason, seq.output_start, cached,
                             list(seq.logprobs) if seq.params and seq.params.logprobs is not None else None,
                             seq.token_ids[:seq.output_start],
                             list(seq.prompt_logprobs) if seq.prompt_logprobs is not None else None)

    def run_until_done(self, seqs: list[Sequence]) -> list[Sequence]:
        """Step until these requests end. When one fails, the others are aborted and its error raised."""
        try:
            while any(s.status in (Status.WAITING, Status.RUNNING) for s in seqs):
                for seq in self.step():
                    if seq.error is not None and any(seq is s for s in seqs):
                        raise seq.error
        except BaseException:
            for seq in seqs:
                self.abort(seq)
            raise
        return seqs

    # -- stats --------------------------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        return self._stats.summary()

    @property
    def step_records(self) -> EngineStats:
        return self._stats

    def reset_stats(self) -> None:
        self._stats.reset()


def rows_by_sequence(seqs: list[Sequence]) -> list[tuple[Sequence, list[int]]]:
    """(seq, [its logits rows]) for each run of the same sequence in `seqs` (a speculative step's rows)."""
    groups: list[tuple[Sequence, list[int]]] = []
    for i, seq in enumerate(seqs):
        if groups and groups[-1][0] is seq:
            groups[-1][1].append(i)
        else:
            groups.append((seq, [i]))
    return groups
