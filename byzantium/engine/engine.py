"""Engine: the model, the paged KV cache, the block manager, the scheduler, the runner and the stats.

Its core is small: add_request (returns the request's Sequence), abort, step (returns the requests that
ended), output. A step is: schedule, forward, postprocess. The blocking helpers (generate, chat, logits,
score, sessions: sync_api.py) and AsyncEngine are written on it; postprocess is the one place a step's
results reach the requests. Around it: the settings (config.py), the model and its kernels
(model_setup.py), memory planning (planning.py), failure isolation (failures.py), speculation
(speculation.py) and riders (riders.py)."""
import itertools
import time
from functools import partial

import torch

from ..kernels import backend_name, warn_once
from . import config as settings
from . import prompt_logprobs
from .config import (DEFAULT_SPECULATIVE_ROWS, DEFAULT_SPECULATIVE_TOKENS, engine_config, resolve_device,
                     resolve_dtype)
from .device_sampling import sample as device_sample
from .failures import EngineFailed, discard, fail, forward_isolating, isolate, shrink_budget
from .grammar import Grammars, advance, masks
from .kv_cache import BlockManager, allocate_kv_cache, kv_attention_backend, kv_cache_dtype
from .layers import parallel
from .loader import generation_config, load_tokenizer, resolve_model
from .model_setup import load_model
from .models import model_class
from .planning import StepPeak, default_num_blocks, memory_held, plan_num_blocks
from .memory import DEFAULT_MEMORY_FRACTION
from .riders import give_logits, part_ways
from .runner import ModelRunner
from .sampling import SamplingParams, make_generator, sample
from .scheduler import Scheduler
from .sequence import Sequence, Session, Status
from .speculation import PromptLookup, StepDrafts, sample_in_order
from .stats import EngineStats
from .tensor_parallel import Peers, build_rank
from .sync_api import RequestOutput, SyncAPI, check_idle, params_list, prompt_list

__all__ = ["Engine", "RequestOutput"]


class Engine(SyncAPI):
    def __init__(self, model=None, **options):
        """model: a hub id, a directory, a GGUF file, or None (the embedded model); options: EngineConfig's."""
        self.engine_config = c = engine_config(model, options)  # bad options fail here, before anything loads
        self.device = resolve_device(c.device)
        self.dtype = resolve_dtype(c.dtype, self.device)
        if self.device.type == "cpu" and self.dtype == torch.bfloat16 and not settings.cpu_has_bf16_units():
            warn_once("byzantium: this CPU has no bf16 units (avx512_bf16 or AMX), so dtype=bfloat16 runs its "
                      "linears converted in software, many times slower than float32 (10x at prefill measured on "
                      "an AVX2 AMD EPYC); use dtype='float32' here")
        self.model_dir = resolve_model(model)  # bad names fail here, before anything heavy
        from transformers import AutoConfig
        checkpoint_config = AutoConfig.from_pretrained(self.model_dir)
        self.model_class = model_class(checkpoint_config)  # unsupported models fail before the weights are read
        self.tokenizer = load_tokenizer(self.model_dir)
        self.cpu_packed_linears, self.cpu_kernels = c.cpu_packed_linears, c.cpu_kernels
        self.peers = None  # the other tensor-parallel ranks (tensor_parallel.py)
        group = parallel.Group(0, c.tensor_parallel_size)
        with parallel.using(group):  # rank 0's slice of the model
            setup = self._load_model(checkpoint_config, self.model_dir)
        if c.tensor_parallel_size > 1:  # after rank 0's load: the others read the kernel choices it cached
            self.peers = Peers(group, self.device, partial(build_rank, self.model_dir, c, self.dtype))
        self.model, self.linear_kernels, self.linear_timings = setup.model, setup.linear_kernels, setup.linear_timings
        self.cpu_layer_ops = setup.cpu_layer_ops
        self.quantization = setup.quantization  # quantization.Fp8Spec, or None
        self.config = self.model.config  # the text model's: a multimodal checkpoint's text_config (Gemma 3)
        context = self.model.max_positions
        window = getattr(self.config, "sliding_window", None)
        if window and getattr(self.config, "use_sliding_window", True) and not getattr(
                self.model, "implements_sliding_window", False):
            context = min(context, window)  # this model's attention has no sliding window: stay inside it
        self.max_model_len = min(c.max_model_len or context, context)
        self.block_size, self.max_num_seqs = c.block_size, c.max_num_seqs
        self.max_batch_tokens = c.max_batch_tokens or max(8192 if self.device.type == "cuda" else 2048, c.max_num_seqs)
        no_kernels = c.attention_backend == "auto" and not c.cpu_kernels and self.device.type == "cpu"
        self.attention_backend = "torch" if no_kernels else c.attention_backend
        self.kv_cache_dtype = kv_cache_dtype(c.kv_cache_dtype, self.dtype)  # "fp8": e4m3 K/V, read by torch or Triton
        self.attention_backend = kv_attention_backend(self.attention_backend, self.kv_cache_dtype, self.dtype,
                                                      self.device)
        self.eos_token_ids = self._eos_ids()
        self.grammars = Grammars(self.tokenizer, self.config.vocab_size, self.eos_token_ids)  # structured outputs
        self.drafter = self._drafter(c.num_speculative_tokens, c.speculative_max_rows)
        self.profile = c.profile  # a step with prefill and decode rows runs them as two timed passes
        self.enforce_eager = c.enforce_eager  # CUDA: no decode graphs (runner.py, cuda_graphs.py)
        self._stats = EngineStats()
        self.step_peak = StepPeak(self.device)
        self._ids = itertools.count()
        self.activations_bytes = None  # measured by the warm-up of memory planning (CUDA)
        num_blocks = c.num_blocks
        if num_blocks is None and c.kv_cache_gib is None and (self.device.type == "cuda" or c.memory_fraction):
            num_blocks = plan_num_blocks(self, c.memory_fraction or DEFAULT_MEMORY_FRACTION)
        self.build_cache(num_blocks or default_num_blocks(self, c.kv_cache_gib))

    def _load_model(self, checkpoint_config, model_dir):
        return load_model(self.model_class, checkpoint_config, model_dir, self.dtype, self.device, self.engine_config)

    def build_cache(self, num_blocks):
        """The KV pool and everything that holds it: block manager, scheduler, runner."""
        self.num_blocks = num_blocks
        self.kv_cache = None  # the old pool (planning's warm-up) goes before the new one is allocated
        self.kv_cache = allocate_kv_cache(self.config.num_hidden_layers, num_blocks, self.block_size,
                                          self.model.num_kv_heads, self.model.head_dim, self.kv_cache_dtype, self.device,
                                          reserve=self.engine_config.kv_cache_gib is not None)
        self.block_manager = BlockManager(num_blocks, self.block_size)
        self.scheduler = Scheduler(self.block_manager, self.max_num_seqs, self.max_batch_tokens, self.drafter,
                                   self.max_model_len)
        limits = dict(max_num_seqs=self.max_num_seqs, max_batch_tokens=self.max_batch_tokens,
                      max_model_len=self.max_model_len)
        graphs = not self.enforce_eager and self.peers is None  # graphs would have to capture the collectives
        self.runner = ModelRunner(self.model, self.kv_cache, self.block_size, self.device, self.attention_backend,
                                  **limits, cuda_graphs=graphs)
        if self.peers is not None:  # every rank its slice of the same pool, and told every step from now on
            self.peers.tell("build_cache", dict(num_blocks=num_blocks, block_size=self.block_size,
                                                kv_dtype=self.kv_cache_dtype, attention_backend=self.attention_backend,
                                                **limits))
            self.runner.peers = self.peers

    def _drafter(self, num_tokens, max_rows):
        """Prompt-lookup speculation (speculation.py): on by default on the CPU, where it is checked to give
        the tokens plain decoding gives; off on CUDA until a GPU run has checked it there."""
        if num_tokens is None:
            num_tokens = DEFAULT_SPECULATIVE_TOKENS if self.device.type == "cpu" else 0
        if not num_tokens:
            return None
        return PromptLookup(num_tokens, max_rows or DEFAULT_SPECULATIVE_ROWS)

    def _eos_ids(self):
        ids = set()
        for source in (self.config, generation_config(self.model_dir), self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            ids.update(value if isinstance(value, (list, tuple)) else [] if value is None else [value])
        return ids

    def describe(self):
        """What this engine runs: model code, kernels, dtype, device, KV pool and batch limits."""
        model_cls = type(self.model)
        return {"model": str(self.model_dir), "architecture": self.model.arch,
                "tensor_parallel_size": self.engine_config.tensor_parallel_size,
                "quantization": None if self.quantization is None else "fp8",  # the only weight format quantized
                "quantization_source": None if self.quantization is None else self.quantization.source,
                "kv_cache_dtype": str(self.kv_cache_dtype).removeprefix("torch."),
                "model_code": f"{model_cls.__module__}.{model_cls.__qualname__}",
                "attention_backend": backend_name(self.runner.ops), "linear_kernels": self.linear_kernels,
                "cpu_layer_ops": self.cpu_layer_ops,
                "fused_gate_up_silu": sum(isinstance(getattr(m, "glu", None), tuple) for m in self.model.modules()),
                "dtype": str(self.dtype).removeprefix("torch."), "device": str(self.device),
                "kv_cache": {"num_blocks": self.num_blocks, "block_size": self.block_size,
                             "bytes": self.kv_cache.numel() * self.kv_cache.element_size()},
                "max_num_seqs": self.max_num_seqs, "max_batch_tokens": self.scheduler.max_batch_tokens,
                "max_model_len": self.max_model_len, "profile": self.profile, "cuda_graphs": self.runner.describe(),
                "speculation": self.drafter.describe() if self.drafter is not None else None}

    def close(self):
        """Stop the other tensor-parallel ranks (an engine on one rank has none)."""
        if self.peers is not None:
            self.peers.close()

    @property
    def memory(self):
        return memory_held(self)

    # -- requests -----------------------------------------------------------------------------------
    def encode(self, prompt):
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

    def check_fits(self, num_tokens, what="prompt"):
        if num_tokens >= self.max_model_len:
            raise ValueError(f"{what} has {num_tokens} tokens; the model's context is {self.max_model_len} "
                             f"tokens and at least one must be left to generate")
        capacity = self.num_blocks * self.block_size
        if num_tokens + 1 > capacity:
            raise ValueError(f"{what} needs {num_tokens + 1} token slots but the KV cache pool holds only "
                             f"{capacity} ({self.num_blocks} blocks of {self.block_size}); raise num_blocks")

    def _check_room(self, total, what):
        capacity = self.num_blocks * self.block_size
        if total > capacity:
            raise ValueError(f"{what} can reach {total} tokens but the KV cache pool holds only {capacity} "
                             f"({self.num_blocks} blocks of {self.block_size}); raise num_blocks or lower max_tokens")

    def new_request_id(self):
        return next(self._ids)

    # -- the core: add requests, abort them, step, read outputs ----------------------------------------
    def add_request(self, prompt, params=None, *, logits=False, tag=None, prompt_logprobs_from=1):
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
            seq.start_turn(params, make_generator(params.seed, self.device), logits_only=params.max_tokens == 0)
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

    def add_requests(self, prompts, params=None, *, logits=False, tag=None, prompt_logprobs_from=None):
        """add_request for each prompt (one prompt, or a list; params: one for all, or one per prompt;
        prompt_logprobs_from: None for 1, or one each). All or nothing: when one is invalid, those already
        queued are aborted and the error raised."""
        prompts = prompt_list(prompts)
        params = [None] * len(prompts) if logits else params_list(params, len(prompts))
        firsts = [1] * len(prompts) if prompt_logprobs_from is None else list(prompt_logprobs_from)
        if len(firsts) != len(prompts):
            raise ValueError(f"got {len(firsts)} prompt_logprobs_from for {len(prompts)} prompts")
        seqs = []
        try:
            for prompt, p, first in zip(prompts, params, firsts):
                seqs.append(self.add_request(prompt, p, logits=logits, tag=tag, prompt_logprobs_from=first))
        except BaseException:
            for seq in seqs:
                self.abort(seq)
            raise
        return seqs

    def abort(self, seq):
        """End a request that is queued or running: it leaves the scheduler and frees its blocks (a session
        keeps what it has computed and becomes idle). A request that already ended is left alone."""
        if seq.status in (Status.WAITING, Status.RUNNING):
            seq.finish_reason = "abort"
            self.scheduler.remove(seq)

    def has_work(self):
        return self.scheduler.has_work()

    def step(self):
        """Schedule, run the forward pass, post-process. Returns the requests that ended in this step:
        finished, or failed (seq.error holds the exception, finish_reason is "error"). Rows whose forward
        pass raises fail alone (failures.py); everything else in the engine goes on. Each step that
        computed anything makes exactly one stats.record call."""
        if not self.scheduler.has_work():
            return []
        start, preempted_before = time.perf_counter(), self.scheduler.num_preemptions
        try:
            rows = self.scheduler.schedule()
        except RuntimeError as error:  # every block is held by sessions: nothing queued can ever run
            return fail(self.scheduler, [(seq, error) for seq in [*self.scheduler.running, *self.scheduler.waiting]])
        cached_tokens, cache_hits = self.scheduler.pop_admitted()
        self.step_peak.start()
        try:
            seqs, logits, failed, phase_seconds = self._execute(rows)
        except EngineFailed as error:  # nothing can run any more: every request gets the error
            for seq in (ended := self.scheduler.take_all()):
                seq.error, seq.finish_reason = error, "error"
            return ended
        except BaseException:  # interrupted (KeyboardInterrupt...): nothing of this step counts
            discard(self.scheduler, self.block_manager, rows, [])
            raise
        ended = []
        if failed:
            rows, seqs, logits, ended = isolate(self.scheduler, self.block_manager, rows, seqs, logits, failed)
        self._stats.totals["preemptions"] += self.scheduler.num_preemptions - preempted_before
        if rows:
            finished, rider_rows = self.postprocess(rows, seqs, logits)
            ended += finished
            self._record(start, rows, rider_rows, cached_tokens, cache_hits, phase_seconds)
        self.step_peak.end()
        return ended

    def _execute(self, rows):
        """The step's forward pass: one fused pass; with profiling on and both phases present, the prefill
        rows then the decode rows, each timed. Returns (seqs, logits, failed, phase_seconds)."""
        phases = {"prefill": [r for r in rows if r.phase == "prefill"], "decode": [r for r in rows if r.phase == "decode"]}
        timed = self.profile and all(phases.values())
        passes = phases.items() if timed else [(None, rows)]
        seqs, logits, failed, phase_seconds = [], [], {}, {} if timed else None
        for phase, part in passes:
            begin = self._clock() if timed else 0.0
            part_seqs, part_logits, part_failed = forward_isolating(self.runner.run, part, self._out_of_memory)
            if timed:
                phase_seconds[phase] = self._clock() - begin
            seqs += part_seqs
            logits += part_logits
            failed.update(part_failed)
        return seqs, torch.cat(logits) if logits else None, failed, phase_seconds

    def _out_of_memory(self, num_tokens, error):
        shrink_budget(self.scheduler, self.device, num_tokens, error)

    def _clock(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the GPU's work so far is inside the time read here
        return time.perf_counter()

    def postprocess(self, rows, seqs, logits):
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
        sampled, accepted, error = sample_in_order(to_sample, lambda index, seqs: self._sample(logits, index, seqs),
                                                   self._check_stop)
        failed = fail(self.scheduler, [(seq, error[1]) for seq in error[0]]) if error else []
        totals["accepted_draft_tokens"] += accepted
        totals["draft_tokens"] += drafts.count()
        drafts.mark_wasted()
        finished += sampled
        ended = {id(seq) for seq in finished + failed}
        rider_rows = part_ways(riders, ended, self.block_manager, self.scheduler, self.runner.copy_block, totals)
        for seq in finished:
            self.scheduler.remove(seq)
        return finished + failed, rider_rows

    def _record(self, start, rows, rider_rows, cached_tokens, cache_hits, phase_seconds):
        step_rows = [(row.seq.tag, row.phase, row.num_tokens, row.seq.seq_id) for row in rows if not row.wasted]
        riders = sum(map(len, self.scheduler.riding.values()))  # served by the step without rows of their own
        self._stats.record(start, time.perf_counter() - start, step_rows + rider_rows,
                           len({r.seq.seq_id for r in rows}) + riders, self.block_manager.num_used,
                           cached_tokens, cache_hits, phase_seconds=phase_seconds)

    def _sample(self, logits, index, seqs):
        allowed = masks(seqs, logits.shape[1], pin=logits.is_cuda)  # structured outputs' grammars (grammar.py)
        if logits.is_cuda:  # all rows at once on the device, one host sync (device_sampling.py)
            picked = logits if index == list(range(len(logits))) else logits.index_select(
                0, torch.tensor(index, device=logits.device))
            tokens, logprobs = device_sample(picked, seqs, allowed)
        else:
            tokens, logprobs = sample(logits.index_select(0, torch.tensor(index, device=logits.device)), seqs, allowed)
        if allowed is not None:
            advance(seqs, tokens)
        return tokens, logprobs

    def _check_stop(self, seq, token):
        params, grammar = seq.params, getattr(seq, "grammar", None)
        if grammar is not None and grammar.error is not None:
            seq.error, seq.finish_reason = ValueError(f"structured output: {grammar.error}"), "error"
            return True
        if grammar is not None and grammar.ended:  # complete, nothing more can follow (or it took EOS)
            seq.finish_reason = "length" if grammar.closed_early else "stop"  # JSON closed by its budget
        elif (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            seq.finish_reason = "stop"
        elif params.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
            hits = [i for i in (text.find(s) for s in params.stop) if i >= 0]
            if hits:
                seq.stop_text_at, seq.finish_reason = min(hits), "stop"
        if seq.finish_reason is None and (seq.num_output >= params.max_tokens or len(seq) >= self.max_model_len):
            seq.finish_reason = "length"
        return seq.finish_reason is not None

    def output(self, seq):
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

    def run_until_done(self, seqs):
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
    def stats(self):
        return self._stats.summary()

    @property
    def step_records(self):
        return self._stats

    def reset_stats(self):
        self._stats.reset()


def rows_by_sequence(seqs):
    """(seq, [its logits rows]) for each run of the same sequence in `seqs` (a speculative step's rows)."""
    groups = []
    for i, seq in enumerate(seqs):
        if groups and groups[-1][0] is seq:
            groups[-1][1].append(i)
        else:
            groups.append((seq, [i]))
    return groups
