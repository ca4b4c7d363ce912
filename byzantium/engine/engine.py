"""Engine: the model, the paged KV cache, the block manager, the scheduler, the runner and the stats.

Its core is small: add_request (returns the request's Sequence), abort, step (returns the requests that
ended), output. The sync helpers (generate, chat, logits, score, continue_) and AsyncEngine are both
written on it; postprocess is the one place a step's results reach the requests."""
import itertools
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .chat import plain_text_ids, render_chat
from .kv_cache import BlockManager, allocate_kv_cache
from .loader import iter_safetensors, load_tokenizer, resolve_model
from .memory import CPU_KV_RAM_SHARE, DEFAULT_MEMORY_FRACTION, kv_blocks, physical_memory
from .models import model_class
from ..kernels import backend_name, cpu_ext, warn_once
from .models.packed import linear_phase, pack_linears, packing_available
from .runner import ModelRunner
from .sampling import SamplingParams, make_generator, sample
from .device_sampling import sample as device_sample
from .scheduler import Scheduler
from .sequence import Row, Sequence, Session, Status
from .speculation import PromptLookup
from .stats import EngineStats

logger = logging.getLogger("byzantium")

# Prompt-lookup speculation on the CPU: draft tokens a request may take a step, and the rows a step may
# hold for drafts to be added (past ~32 rows a CPU step is compute-bound: extra rows cost, not ride free).
DEFAULT_SPECULATIVE_TOKENS = 4
DEFAULT_SPECULATIVE_ROWS = 32

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass
class RequestOutput:
    request_id: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: list | None = None
    prompt_token_ids: list[int] = field(default_factory=list, repr=False)


class Outputs(list):
    """A list of RequestOutput; when it holds one output, its attributes read through (outs.text)."""

    def __getattr__(self, name):
        if len(self) == 1:
            return getattr(self[0], name)
        raise AttributeError(f"{len(self)} outputs: index one to read {name!r}")


def resolve_device(device):
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA device")
    return device


def cpu_has_bf16_units():
    """Whether this CPU multiplies bf16 in hardware (avx512_bf16 or AMX), where oneDNN and our bf16 panels run."""
    probes = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return any(probe() for probe in probes if probe is not None)


def resolve_dtype(dtype, device):
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def out_of_memory(error):
    """An allocation failure: CUDA's OutOfMemoryError, Python's MemoryError, or torch's CPU allocator
    failing (a RuntimeError "DefaultCPUAllocator: can't allocate memory: you tried to allocate ...").
    Only these make a step retry smaller; other errors are not about its size."""
    return (isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError))
            or isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def _positive(name, value):
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")



def log_softmax_rows(logits):
    """log-softmax of logits rows (a CPU tensor) in numpy, float64: single-threaded on purpose, because the
    AsyncEngine calls it on the event loop's thread, where a parallel torch op would start a second OpenMP
    team and slow every step (see AsyncEngine.__init__)."""
    x = logits.numpy().astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))

class Engine:
    def __init__(self, model=None, device=None, dtype=None, block_size=16, num_blocks=None, max_num_seqs=256,
                 max_batch_tokens=None, attention_backend="auto", max_model_len=None, kv_cache_gib=None,
                 cpu_packed_linears=True, cpu_kernels=True, profile=False, memory_fraction=None, enforce_eager=False,
                 num_speculative_tokens=None, speculative_max_rows=None):
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_batch_tokens", "max_model_len",
                     "speculative_max_rows"):
            _positive(name, locals()[name])
        if num_speculative_tokens is not None and (not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 0):
            raise ValueError(f"num_speculative_tokens must be an integer >= 0, got {num_speculative_tokens!r}")
        if memory_fraction is not None and not 0 < memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if self.device.type == "cpu" and self.dtype == torch.bfloat16 and not cpu_has_bf16_units():
            warn_once("byzantium: this CPU has no bf16 units (avx512_bf16 or AMX), so dtype=bfloat16 runs its "
                      "linears converted in software, many times slower than float32 (10x at prefill measured on "
                      "an AVX2 AMD EPYC); use dtype='float32' here")
        model_dir = resolve_model(model)  # bad names fail here, before anything heavy
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(model_dir)
        self.model_class = model_class(config)  # unsupported models fail before the weights are read
        self.config, self.model_dir = config, model_dir
        self.tokenizer = load_tokenizer(model_dir)
        self.cpu_packed_linears = cpu_packed_linears  # fp32 on CPU: repacked weights (models/packed.py)
        # fp32 on CPU: Byzantium's compiled kernels (kernels/cpu_ext.py) for the linears and decode
        # attention; off, or when they cannot be built: oneDNN-prepacked weights and the torch reference.
        self.cpu_kernels = cpu_kernels
        self.model = self._load_model(config, model_dir)

        self.config = self.model.config  # the text model's: a multimodal checkpoint's text_config (Gemma 3)
        context = self.model.max_positions
        window = getattr(self.config, "sliding_window", None)
        if window and getattr(self.config, "use_sliding_window", True) and not getattr(
                self.model, "implements_sliding_window", False):
            context = min(context, window)  # this model's attention has no sliding window: stay inside it
        self.max_model_len = min(max_model_len or context, context)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens or max(8192 if self.device.type == "cuda" else 2048, max_num_seqs)
        if attention_backend == "auto" and not cpu_kernels and self.device.type == "cpu":
            attention_backend = "torch"
        self.attention_backend = attention_backend
        self.eos_token_ids = self._eos_ids(model_dir)
        self.drafter = self._drafter(num_speculative_tokens, speculative_max_rows)
        # Profiling: a step with prefill and decode rows runs them as two timed forward passes (same outputs).
        self.profile = profile
        self.enforce_eager = enforce_eager  # CUDA: no decode graphs (runner.py, cuda_graphs.py); CPU is always eager
        self._stats = EngineStats()
        self.activations_peak = 0  # CUDA: the most one step allocated beyond what it started with
        self._ids = itertools.count()
        self.activations_bytes = None  # measured by the warm-up of memory planning (CUDA)
        if num_blocks is None and kv_cache_gib is None and (self.device.type == "cuda" or memory_fraction):
            num_blocks = self._plan_num_blocks(memory_fraction or DEFAULT_MEMORY_FRACTION)
        self._build_cache(num_blocks or self._default_num_blocks(kv_cache_gib))

    def _build_cache(self, num_blocks):
        """The KV pool and everything that holds it: block manager, scheduler, runner."""
        self.num_blocks = num_blocks
        self.kv_cache = None  # the old pool (planning's warm-up) goes before the new one is allocated
        self.kv_cache = allocate_kv_cache(self.config.num_hidden_layers, num_blocks, self.block_size,
                                          self.model.num_kv_heads, self.model.head_dim, self.dtype, self.device)
        self.block_manager = BlockManager(num_blocks, self.block_size)
        self.scheduler = Scheduler(self.block_manager, self.max_num_seqs, self.max_batch_tokens, self.drafter,
                                   self.max_model_len)
        self.runner = ModelRunner(self.model, self.kv_cache, self.block_size, self.device, self.attention_backend,
                                  max_num_seqs=self.max_num_seqs, max_batch_tokens=self.max_batch_tokens,
                                  max_model_len=self.max_model_len, cuda_graphs=not self.enforce_eager)

    def _drafter(self, num_tokens, max_rows):
        """Prompt-lookup speculation (speculation.py): on by default on the CPU, where it is checked to give
        the tokens plain decoding gives; off on CUDA until a GPU run has checked it there."""
        if num_tokens is None:
            num_tokens = DEFAULT_SPECULATIVE_TOKENS if self.device.type == "cpu" else 0
        if not num_tokens:
            return None
        return PromptLookup(num_tokens, max_rows or DEFAULT_SPECULATIVE_ROWS)

    def _plan_num_blocks(self, fraction):
        """KV blocks from what is left of this engine's share of the device (`fraction` of its memory:
        weights, activations and KV together) once the weights are loaded and a warm-up forward at the
        largest step the scheduler forms (max_batch_tokens of prefill) has measured the activations, as
        serving engines plan it. On CPU the share is of RAM and activations are not measured."""
        per_block = self._block_bytes()
        warm_blocks = -(-self.max_batch_tokens // self.block_size) + self.max_num_seqs
        self._build_cache(warm_blocks)
        activations = self._warm_up()
        self.activations_bytes = activations
        weights = self.memory["weights_bytes"]
        if self.device.type == "cuda":
            # The warm-up's pool and everything holding it (runner buffers, graphs) go before measuring.
            self.kv_cache = self.runner = self.block_manager = self.scheduler = None
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info(self.device)
        else:
            total = free = physical_memory()
        blocks = kv_blocks(total, fraction, weights, activations or 0, free, per_block)
        enough = self.max_num_seqs * -(-self.max_model_len // self.block_size)
        if blocks < 1:
            raise ValueError(f"{self.model_dir} does not fit in memory_fraction={fraction} of the {self.device} "
                             f"({total / 2**30:.1f} GiB): weights {weights / 2**30:.2f} GiB, activations "
                             f"{(activations or 0) / 2**30:.2f} GiB leave nothing for the KV cache; raise "
                             f"memory_fraction or lower max_batch_tokens")
        return min(blocks, enough)

    def _warm_up(self):
        """Run the largest prefill step (dummy tokens, logits only) and, on CUDA, a sampled step of
        max_num_seqs single-token rows (the most logits rows, top-k/top-p sorts, the largest decode CUDA
        graph); the most a step of them allocated beyond what it started with (CUDA; None elsewhere).
        Leaves no trace in the stats."""
        per = max(1, min(self.max_model_len - 1, self.max_batch_tokens))
        prompts, left = [], self.max_batch_tokens
        while left > 0 and len(prompts) < self.max_num_seqs:
            prompts.append([0] * min(per, left))
            left -= len(prompts[-1])
        cuda = self.device.type == "cuda"
        self.activations_peak = 0
        self.logits(prompts, tag="warm-up")
        if cuda:
            rows = SamplingParams(max_tokens=2, temperature=1.0, top_k=50, top_p=0.9, seed=0)
            self.generate([[0]] * self.max_num_seqs, rows, tag="warm-up")
        self.reset_stats()
        if not cuda:
            return None
        torch.cuda.synchronize(self.device)
        return self.activations_peak

    def _block_bytes(self):
        return (2 * self.config.num_hidden_layers * self.block_size * self.model.num_kv_heads * self.model.head_dim
                * self.dtype.itemsize)

    # -- construction helpers -----------------------------------------------------------------------
    def _load_model(self, config, model_dir):
        with torch.device("meta"):  # no random init of weights we overwrite anyway
            model = self.model_class(config)
        # Cast on meta first, so every weight is allocated once, at the target dtype (casting after
        # to_empty would hold an fp32 copy: twice the bf16 weights at the peak).
        model = model.to(self.dtype).to_empty(device=self.device)
        model.init_buffers(self.device)  # what to_empty left uninitialised: rope tables, tied weights
        model.load_weights(iter_safetensors(model_dir, self.device))  # one tensor at a time, straight to the device
        # Linears: "torch", or {"INxOUT": {"decode": kernel, "prefill": kernel}} as measured on this CPU.
        self.linear_kernels, self.linear_timings = "torch", {}
        if self.cpu_packed_linears and self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16):
            fp32 = self.dtype == torch.float32
            kernels = cpu_ext.load() if self.cpu_kernels else None  # load() logs why it is None; bf16: its panels
            onednn = packing_available(self.device, self.dtype)
            if fp32 and kernels is None and not onednn:
                warn_once("byzantium: oneDNN weight packing does not work in this torch build; "
                          "the linears are plain torch (slower on the CPU)")
            self.linear_kernels, self.linear_timings = pack_linears(model, kernels, onednn, self.dtype)
        # The norms, rotary embedding and SiLU * up as single compiled passes (fp32 on the CPU; bf16 norms and
        # rope with avx512_bf16); gate_up fused with SiLU * up where it runs on the panels (fp32 AVX2 or AVX-512, bf16).
        compiled = (self.cpu_kernels and self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16)
                    and hasattr(model, "use_cpu_ops") and cpu_ext.load() is not None)
        if compiled:
            model.use_cpu_ops(cpu_ext.load())
        self.cpu_layer_ops = compiled and (self.dtype == torch.float32 or cpu_ext.load().avx512_bf16_supported())
        # Where a shape's decode and prefill kernels differ, a step runs its phases as two passes.
        self.split_phases = isinstance(self.linear_kernels, dict) and any(
            len(set(choice.values())) > 1 for choice in self.linear_kernels.values())
        return model.eval()

    def describe(self):
        """What this engine runs: model code, kernels, dtype, device, KV pool and batch limits."""
        model_cls = type(self.model)
        return {"model": str(self.model_dir), "architecture": self.model.arch,
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

    def _default_num_blocks(self, kv_cache_gib):
        per_block = self._block_bytes()
        if kv_cache_gib is not None:
            budget = kv_cache_gib * 2**30
        else:  # the pool's pages cost memory only once written (allocate_kv_cache); cap the worst case
            budget = CPU_KV_RAM_SHARE * physical_memory()
        enough = self.max_num_seqs * -(-self.max_model_len // self.block_size)  # every sequence at full length
        return max(1, min(int(budget // per_block), enough))

    @property
    def memory(self):
        """Bytes held: the weights, the KV pool (and how much of it is in use now), and on CUDA the peak
        of everything else (activations, workspaces) one of this engine's steps allocated."""
        seen, weights = set(), 0
        # Packed CPU linears hold their weights per phase ({phase: tensor}; one tensor when both phases share it).
        packed = [w for m in self.model.modules() if isinstance(getattr(m, "packed", None), dict)
                  for w in m.packed.values() if isinstance(w, torch.Tensor)]
        for t in [*self.model.parameters(), *self.model.buffers(), *packed]:
            key = id(t) if t.is_mkldnn else t.data_ptr()  # oneDNN's packed weights have no storage pointer
            if t.device.type != "meta" and key not in seen:
                seen.add(key)
                weights += t.numel() * t.element_size()
        kv = self.kv_cache.numel() * self.kv_cache.element_size()
        peak = self.activations_peak if self.device.type == "cuda" else None
        return {"weights_bytes": weights, "kv_cache_bytes": kv, "kv_blocks": self.num_blocks,
                "kv_blocks_used": self.block_manager.num_used, "activations_peak_bytes": peak}

    def _eos_ids(self, model_dir):
        ids = set()
        for source in (self.config, _generation_config(model_dir), self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            ids.update(value if isinstance(value, (list, tuple)) else [] if value is None else [value])
        return ids

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

    def _check_fits(self, num_tokens, what="prompt"):
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

    # -- the core: add requests, abort them, step, read outputs ----------------------------------------
    def add_request(self, prompt, params=None, *, logits=False, tag=None):
        """Queue one request and return its Sequence; step() advances it.

        prompt: text (tokenized as raw text, special tokens parsed), token ids, or a Session (the request
        is a turn that continues it). logits=True: one forward pass, the next-token logits in seq.logits,
        no token sampled (params unused). tag labels the request in the stats."""
        if isinstance(prompt, Session):
            self._check_idle(prompt)
            seq = prompt.seq
        else:
            ids = self.encode(prompt)
            self._check_fits(len(ids))
            seq = Sequence(next(self._ids), ids, None)
        if logits:
            seq.start_turn(None, None, logits_only=True)
        else:
            params = SamplingParams() if params is None else params
            if not isinstance(params, SamplingParams):
                raise TypeError(f"expected SamplingParams, got {type(params).__name__}")
            what = f"{prompt}" if isinstance(prompt, Session) else "this request"
            self._check_room(min(len(seq) + params.max_tokens, self.max_model_len), what)
            seq.start_turn(params, make_generator(params.seed, self.device))
        if isinstance(prompt, Session):
            self._recompute_last(seq)
        seq.tag = prompt.tag if tag is None and isinstance(prompt, Session) else tag
        self._stats.totals["requests"] += 1
        self.scheduler.add(seq)
        return seq

    def add_requests(self, prompts, params=None, *, logits=False, tag=None):
        """add_request for each prompt (one prompt, or a list; params: one for all, or one per prompt).
        All or nothing: when one is invalid, those already queued are aborted and the error raised."""
        prompts = self._prompt_list(prompts)
        params = [None] * len(prompts) if logits else self._params_list(params, len(prompts))
        seqs = []
        try:
            for prompt, p in zip(prompts, params):
                seqs.append(self.add_request(prompt, p, logits=logits, tag=tag))
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
        finished, or failed (seq.error holds the exception, finish_reason is "error").

        A forward pass that raises is retried on halves of its rows until the rows that raise on their
        own are found (rows are independent: a rerun rewrites the same K/V); only their requests fail.
        Out of memory (see out_of_memory) also lowers the token budget of later steps, and a single long
        chunk is retried in two. Everything else in the engine goes on. Each step that computed anything
        makes exactly one stats.record call."""
        if not self.scheduler.has_work():
            return []
        start = time.perf_counter()
        preempted_before = self.scheduler.num_preemptions
        try:
            rows = self.scheduler.schedule()
        except RuntimeError as error:  # every block is held by sessions: nothing queued can ever run
            return self._fail([(seq, error) for seq in [*self.scheduler.running, *self.scheduler.waiting]])
        cached_tokens, cache_hits = self.scheduler.pop_admitted()
        held = self._step_memory_start()
        try:
            seqs, logits, failed, phase_seconds = self._execute(rows)
        except BaseException:  # interrupted (KeyboardInterrupt...): nothing of this step counts
            self._discard(rows, [])
            raise
        ended = []
        if failed:
            rows, seqs, logits, ended = self._isolate(rows, seqs, logits, failed)
        self._stats.totals["preemptions"] += self.scheduler.num_preemptions - preempted_before
        if rows:
            ended += self.postprocess(rows, seqs, logits)
            step_rows = [(row.seq.tag, row.phase, row.num_tokens, row.seq.seq_id) for row in rows if not row.wasted]
            step_rows += self._riders_rows  # the tokens of the requests that rode on a row (stats: by tag too)
            riders = sum(map(len, self.scheduler.riding.values()))  # served by the step without rows of their own
            self._stats.record(start, time.perf_counter() - start, step_rows, len({r.seq.seq_id for r in rows}) + riders,
                               self.block_manager.num_used,
                               cached_tokens, cache_hits, phase_seconds=phase_seconds)
        self._step_memory_end(held)
        return ended

    def _step_memory_start(self):
        """CUDA: what is allocated as a step starts, the device's peak counter reset to it."""
        if self.device.type != "cuda":
            return None
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)

    def _step_memory_end(self, held):
        """Keep the most this step (forward pass and sampling) allocated beyond what it started with: this
        engine's own, whatever other engines on the device hold (an LLMPool)."""
        if held is not None:
            self.activations_peak = max(self.activations_peak, torch.cuda.max_memory_allocated(self.device) - held)

    def _execute(self, rows):
        """The step's forward pass: one fused pass; with both phases present and profiling on (each pass
        timed) or phase-specific linear kernels, the prefill rows then the decode rows. Returns (seqs,
        logits, failed, phase_seconds)."""
        phases = {"prefill": [r for r in rows if r.phase == "prefill"], "decode": [r for r in rows if r.phase == "decode"]}
        split = (self.profile or self.split_phases) and all(phases.values())
        timed = self.profile and split
        seqs, logits, failed, phase_seconds = [], [], {}, {} if timed else None
        passes = phases.items() if split else [("prefill" if phases["prefill"] else "decode", rows)]
        for phase, part in passes:
            begin = self._clock() if timed else 0.0
            with linear_phase(phase):
                part_seqs, part_logits, part_failed = self._forward(part)
            if timed:
                phase_seconds[phase] = self._clock() - begin
            seqs += part_seqs
            logits += part_logits
            failed.update(part_failed)
        return seqs, torch.cat(logits) if logits else None, failed, phase_seconds

    def _clock(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the GPU's work so far is inside the time read here
        return time.perf_counter()

    def _forward(self, rows):
        """runner.run over rows, retried smaller when it raises (see step). Returns (seqs, [logits]
        tensors, {seq_id: (seq, error)} of the rows that failed on their own)."""
        try:
            seqs, logits = self.runner.run(rows)
            return seqs, [] if logits is None else [logits], {}
        except Exception as error:  # noqa: BLE001 - isolated below, given to the failing requests
            oom = out_of_memory(error)
            if oom:
                self._shrink_budget(sum(r.num_tokens for r in rows), error)
            if len(rows) > 1:
                half = len(rows) // 2
                parts = [rows[:half], rows[half:]]
            elif oom and rows[0].num_tokens > 1:  # one long chunk: its first half, then the rest
                row, half = rows[0], rows[0].num_tokens // 2
                parts = [[Row(row.seq, row.start, half)], [Row(row.seq, row.start + half, row.num_tokens - half)]]
            else:
                return [], [], {rows[0].seq.seq_id: (rows[0].seq, error)}
        seqs, logits, failed = [], [], {}
        for part in parts:
            if any(r.seq.seq_id in failed for r in part):  # the second half of a chunk whose first half failed
                continue
            part_seqs, part_logits, part_failed = self._forward(part)
            seqs += part_seqs
            logits += part_logits
            failed.update(part_failed)
        return seqs, logits, failed

    def _shrink_budget(self, num_tokens, error):
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        budget = max(1, min(self.scheduler.max_batch_tokens, num_tokens // 2))
        logger.warning("byzantium: out of memory in a forward pass of %d tokens (%s); retrying it in smaller "
                       "parts; steps now take at most %d tokens", num_tokens, str(error)[:200], budget)
        self.scheduler.max_batch_tokens = budget

    def _isolate(self, rows, seqs, logits, failed):
        """After rows failed: fail their requests, undo what they scheduled; keep the rest of the step."""
        errors = {type(e).__name__ + ": " + str(e)[:200] for _, e in failed.values()}
        logger.error("byzantium: a forward pass failed for %d of %d requests (%s); they get the error, the "
                     "others go on", len(failed), len(rows), "; ".join(sorted(errors)))
        failed_rows = [r for r in rows if r.seq.seq_id in failed]
        kept, bad = self._discard(rows, failed_rows)
        for seq, _ in failed.values():
            if seq.pinned and bad.intersection(seq.block_table):  # its prefix hit was never computed
                self.block_manager.release(seq)
        ended = self._fail(failed.values())
        kept_ids = {r.seq.seq_id for r in kept}
        keep = [i for i, seq in enumerate(seqs) if seq.seq_id in kept_ids]
        if len(keep) < len(seqs):
            seqs = [seqs[i] for i in keep]
            logits = logits[torch.tensor(keep, device=logits.device)] if keep else None
        return kept, seqs, logits, ended

    def _discard(self, rows, lost):
        """The compute of `lost` rows (all rows when `lost` is empty: an interrupted step) did not happen:
        unhash the blocks they were to fill. A row that took such a block as a prefix hit in this step
        read K/V never written: its sequence is preempted (recomputed later). Returns (kept rows, the
        unhashed blocks)."""
        lost_ids = {r.seq.seq_id for r in (lost or rows)}
        bad = set()
        for row in lost or rows:
            bad |= self.block_manager.unregister_uncomputed(row.seq)
        kept = [r for r in rows if r.seq.seq_id not in lost_ids]
        if not lost:  # interrupted: every row is recomputed
            for row in rows:
                self.scheduler.preempt(row.seq)
            return [], bad
        while True:
            readers = [r for r in kept if bad.intersection(r.seq.block_table)]
            if not readers:
                return kept, bad
            for row in readers:
                kept.remove(row)
                bad |= self.block_manager.unregister_uncomputed(row.seq)
                self.scheduler.preempt(row.seq)

    def _fail(self, seq_errors):
        ended = []
        for seq, error in seq_errors:
            seq.error, seq.finish_reason = error, "error"
            self.scheduler.remove(seq)
            ended.append(seq)
        return ended

    def postprocess(self, rows, seqs, logits):
        """After a forward pass: the rows' tokens are computed; each sequence a row ended (`seqs`, one
        `logits` row each; a speculative step's sequence one per row) gets its logits (a logits request) or
        its next tokens, and may finish; so does each sequence riding on it (scheduler.riding), from the
        same logits. Returns the requests that finished (or failed: sampling raised)."""
        drafts, verifying, last_row = {}, {}, {}
        for row in rows:
            row.seq.num_computed = row.end
            last_row[row.seq.seq_id] = row
            if row.verify:
                verifying.setdefault(row.seq.seq_id, [row.seq, len(row.seq), []])[2].append(row)
            if row.token is not None:
                drafts.setdefault(row.seq.seq_id, []).append(row.token)
        groups = []  # (seq, its logits rows)
        for i, seq in enumerate(seqs):
            if groups and groups[-1][0] is seq:
                groups[-1][1].append(i)
            else:
                groups.append((seq, [i]))
        finished, to_sample, riders = [], [], []
        for seq, index in groups:
            if seq.logits_only:
                seq.logits, seq.finish_reason = logits[index[0]].cpu(), "logits"
                finished.append(seq)
                for rider in self.scheduler.riding.get(seq.seq_id, ()):  # the same scoring prompt
                    rider.logits, rider.finish_reason = seq.logits, "logits"
                    finished.append(rider)
                    self._stats.totals["shared_prefill_tokens"] += last_row[seq.seq_id].num_tokens
                continue
            draft = drafts.get(seq.seq_id, [])
            to_sample.append((seq, index, draft, True))
            for rider in self.scheduler.riding.get(seq.seq_id, ()):
                to_sample.append((rider, index, draft, False))
                riders.append((rider, seq, len(rider), last_row[seq.seq_id]))
        for seq, _, _, _ in to_sample:
            seq.num_computed = len(seq)  # every token it had is computed now (riders: by their leader's rows)
        failed = []
        position = 0
        while to_sample:  # the rows of a sequence's step in turn: plain steps take one round, drafts more
            sampled = [seq for seq, _, _, _ in to_sample]
            try:
                tokens, logprobs = self._sample(logits, [index[position] for _, index, _, _ in to_sample], sampled)
            except Exception as error:  # noqa: BLE001 - e.g. NaN logits: these requests fail, not the engine
                logger.error("byzantium: sampling failed for %d requests (%s: %s)", len(sampled), type(error).__name__, error)
                failed += self._fail((seq, error) for seq in sampled)
                break
            going = []
            for (seq, index, draft, own), token, lp in zip(to_sample, tokens, logprobs):
                seq.token_ids.append(token)
                seq.num_computed = len(seq) - 1  # accepted drafts' K/V are computed, the newest token's not
                if lp is not None:
                    seq.logprobs.append(lp)
                accepted = position < len(draft) and token == draft[position]
                self._stats.totals["accepted_draft_tokens"] += accepted and own
                if self._check_stop(seq, token):
                    finished.append(seq)
                elif accepted:  # the draft is the token sampled: the next row's logits follow from it
                    going.append((seq, index, draft, own))
            to_sample, position = going, position + 1
        for draft in drafts.values():
            self._stats.totals["draft_tokens"] += len(draft)
        for seq, before, verify_rows in verifying.values():  # row i gave the step's i-th token, if it got that far
            for row in verify_rows[len(seq) - before:]:
                row.wasted = True
        self._riders_rows = []
        ended = {id(seq) for seq in finished + failed}
        for rider, leader, before, row in riders:
            if row.phase == "prefill":  # a prompt it did not compute; its first token is not a decode token
                self._stats.totals["shared_prefill_tokens"] += row.num_tokens
            elif len(rider) > before:
                self._riders_rows.append((rider.tag, "decode", len(rider) - before, rider.seq_id))
                self._stats.totals["shared_decode_tokens"] += len(rider) - before
            # A rider that sampled other tokens than its leader writes elsewhere from now on.
            if id(rider) not in ended and rider.token_ids != leader.token_ids:
                if not self.block_manager.unshare(rider, self._copy_block):
                    self.scheduler.preempt(rider)  # no free block for its copy: recomputed later
        for seq in finished:
            self.scheduler.remove(seq)
        return finished + failed

    def _copy_block(self, src, dst):
        self.kv_cache[:, :, dst].copy_(self.kv_cache[:, :, src])

    def _sample(self, logits, index, seqs):
        if logits.is_cuda:  # all rows at once on the device, one host sync (device_sampling.py)
            picked = logits if index == list(range(len(logits))) else logits.index_select(
                0, torch.tensor(index, device=logits.device))
            return device_sample(picked, seqs)
        return sample(logits.index_select(0, torch.tensor(index, device=logits.device)), seqs)

    def _check_stop(self, seq, token):
        params = seq.params
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
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
        return RequestOutput(seq.seq_id, text, list(ids), seq.finish_reason, seq.output_start, cached,
                             list(seq.logprobs) if seq.params and seq.params.logprobs is not None else None,
                             seq.token_ids[:seq.output_start])

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

    # -- public operations (the sync helpers on the core above) ---------------------------------------
    @staticmethod
    def _params_list(params, n):
        params = SamplingParams() if params is None else params
        params = list(params) if isinstance(params, (list, tuple)) else [params] * n
        if len(params) != n:
            raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
        return params

    @staticmethod
    def _prompt_list(prompts):
        """A single prompt (a string, a list of ints, a Session) or a list of prompts -> a list of prompts."""
        if isinstance(prompts, (str, Session)) or (isinstance(prompts, (list, tuple)) and prompts and
                                                   all(isinstance(t, int) for t in prompts)):
            return [prompts]
        return list(prompts)

    def generate(self, prompts, params=None, *, tag=None):
        """Generate for each prompt (raw text, no template, or token ids); outputs in prompt order."""
        seqs = self.run_until_done(self.add_requests(prompts, params, tag=tag))
        return Outputs(self.output(s) for s in seqs)

    def render_chat(self, conversation, untrusted=False, add_generation_prompt=True):
        """Token ids of a conversation under the model's chat template (see chat.render_chat)."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer, so no chat template")
        return render_chat(self.tokenizer, conversation, add_generation_prompt=add_generation_prompt, untrusted=untrusted)

    def chat_prompts(self, conversations, untrusted=False):
        """Token ids of each conversation (one conversation, or a list of them)."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        return [self.render_chat(c, untrusted) for c in conversations]

    def chat(self, conversations, params=None, untrusted=False, *, tag=None):
        """Generate replies to conversations (lists of {"role", "content"[, "untrusted"]} messages)."""
        return self.generate(self.chat_prompts(conversations, untrusted), params, tag=tag)

    def logits(self, prompts, *, tag=None):
        """Next-token logits (fp32, [len(prompts), vocab]) after each prompt or session, in one batched
        forward pass when the prompts fit in max_batch_tokens. Sessions stay where they are."""
        seqs = self.run_until_done(self.add_requests(prompts, logits=True, tag=tag))
        return torch.stack([s.logits for s in seqs])

    def candidate_token_ids(self, candidates):
        """The first token of each candidate continuation (tokenized as plain text)."""
        ids = []
        for c in candidates:
            tokens = plain_text_ids(self.tokenizer, c) if isinstance(c, str) else [int(c)]
            if not tokens:
                raise ValueError(f"candidate {c!r} has no tokens")
            ids.append(tokens[0])
        return ids

    def score(self, prompts, candidates, *, tag=None):
        """For each prompt, {candidate: log-probability of the candidate's first token as the next token}.

        candidates: one list for every prompt, or one list per prompt. One batched forward pass."""
        prompts = self._prompt_list(prompts)
        per_prompt = self.candidate_lists(prompts, candidates)
        return self.logprobs_of(self.logits(prompts, tag=tag), per_prompt)

    @staticmethod
    def candidate_lists(prompts, candidates):
        """One candidate list per prompt: `candidates` is shared, or already one list per prompt."""
        per_prompt = candidates if candidates and isinstance(candidates[0], (list, tuple)) else [candidates] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"got {len(per_prompt)} candidate lists for {len(prompts)} prompts")
        return per_prompt

    def logprobs_of(self, logits, per_prompt):
        logprobs = log_softmax_rows(logits)
        return [dict(zip(cands, logprobs[i, self.candidate_token_ids(cands)].tolist()))
                for i, cands in enumerate(per_prompt)]

    # -- sessions -----------------------------------------------------------------------------------
    def open_session(self, prompt, *, tag=None):
        """A pinned sequence for round-robin turns; its KV stays cached until close_session. Its requests
        carry `tag` unless they are given their own."""
        ids = self.encode(prompt)
        self._check_fits(len(ids), "session prompt")
        return Session(Sequence(next(self._ids), ids, None, pinned=True, status=Status.IDLE), tag)

    def _check_idle(self, session):
        if not isinstance(session, Session):
            raise TypeError(f"expected a Session, got {type(session).__name__}")
        if session.seq.status is not Status.IDLE:
            raise ValueError(f"{session} is not idle: it is closed or has a request in flight")

    def extend(self, session, tokens_or_text):
        """Append tokens (ids, or text tokenized as plain untrusted text) to the session; only they get
        prefilled on the next continue_."""
        self._check_idle(session)
        if isinstance(tokens_or_text, str):
            ids = plain_text_ids(self.tokenizer, tokens_or_text)
        else:
            ids = [int(t) for t in tokens_or_text]
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ValueError(f"token ids {bad[:5]} are outside the vocabulary")
        self._check_fits(session.num_tokens + len(ids), "extended session")
        session.seq.token_ids.extend(ids)
        return len(ids)

    @staticmethod
    def _recompute_last(seq):
        # Every token computed (after a logits call): recompute the last one to get its logits again.
        if seq.num_computed == len(seq):
            seq.num_computed -= 1
            seq.turn_start = seq.num_computed

    def continue_(self, sessions, params=None, *, tag=None):
        """Generate from where each session stands, keeping the KV; the tokens join the session."""
        seqs = self.run_until_done(self.add_requests(sessions, params, tag=tag))
        return Outputs(self.output(s) for s in seqs)

    def close_session(self, session):
        """Free the session's blocks, whatever it is doing: a request in flight on it is aborted first."""
        if not isinstance(session, Session):
            raise TypeError(f"expected a Session, got {type(session).__name__}")
        if session.seq.status is Status.CLOSED:
            return
        self.abort(session.seq)
        self.block_manager.release(session.seq)
        session.seq.status = Status.CLOSED

    # -- stats --------------------------------------------------------------------------------------
    @property
    def stats(self):
        return self._stats.summary()

    @property
    def step_records(self):
        return self._stats

    def reset_stats(self):
        self._stats.reset()


def _generation_config(model_dir):
    try:
        from transformers import GenerationConfig
        return GenerationConfig.from_pretrained(model_dir)
    except (OSError, ValueError):
        return None
