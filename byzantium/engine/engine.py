"""Engine: add requests, step(), generate(), chat(), score(), sessions. Owns the model, the paged KV
cache, the block manager, the scheduler, the runner and the stats."""
import itertools
import time
from dataclasses import dataclass, field

import torch

from .chat import plain_text_ids, render_chat
from .kv_cache import BlockManager, allocate_kv_cache
from .loader import iter_safetensors, load_tokenizer, resolve_model
from .models.llama import LlamaForCausalLM, architecture_of, rope_tables
from ..kernels import cpu_ext
from .models.packed import pack_linears, packing_available
from .runner import ModelRunner
from .sampling import SamplingParams, make_generator, sample
from .scheduler import Scheduler
from .sequence import Sequence, Session, Status
from .stats import EngineStats

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


def resolve_dtype(dtype, device):
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _positive(name, value):
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class Engine:
    def __init__(self, model=None, device=None, dtype=None, block_size=16, num_blocks=None, max_num_seqs=256,
                 max_batch_tokens=None, attention_backend="auto", max_model_len=None, kv_cache_gib=None,
                 cpu_packed_linears=True, cpu_kernels=True):
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_batch_tokens", "max_model_len"):
            _positive(name, locals()[name])
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        model_dir = resolve_model(model)  # bad names fail here, before anything heavy
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(model_dir)
        architecture_of(config)  # unsupported models fail before the weights are read
        self.config, self.model_dir = config, model_dir
        self.tokenizer = load_tokenizer(model_dir)
        self.cpu_packed_linears = cpu_packed_linears  # fp32 on CPU: repacked weights (models/packed.py)
        # fp32 on CPU: Byzantium's compiled kernels (kernels/cpu_ext.py) for the linears and decode
        # attention; off, or when they cannot be built: oneDNN-prepacked weights and the torch reference.
        self.cpu_kernels = cpu_kernels
        self.model = self._load_model(config, model_dir)

        context = config.max_position_embeddings
        window = getattr(config, "sliding_window", None)
        if window and getattr(config, "use_sliding_window", True):
            context = min(context, window)  # no sliding-window attention here: stay inside the window
        self.max_model_len = min(max_model_len or context, context)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens or max(8192 if self.device.type == "cuda" else 2048, max_num_seqs)
        self.num_blocks = num_blocks or self._default_num_blocks(kv_cache_gib)
        self.kv_cache = allocate_kv_cache(config.num_hidden_layers, self.num_blocks, block_size,
                                          self.model.num_kv_heads, self.model.head_dim, self.dtype, self.device)
        self.block_manager = BlockManager(self.num_blocks, block_size)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, self.max_batch_tokens)
        if attention_backend == "auto" and not cpu_kernels and self.device.type == "cpu":
            attention_backend = "torch"
        self.runner = ModelRunner(self.model, self.kv_cache, block_size, self.device, attention_backend)
        self.eos_token_ids = self._eos_ids(model_dir)
        self._stats = EngineStats()
        self._ids = itertools.count()

    # -- construction helpers -----------------------------------------------------------------------
    def _load_model(self, config, model_dir):
        with torch.device("meta"):  # no random init of weights we overwrite anyway
            model = LlamaForCausalLM(config)
        model = model.to_empty(device=self.device).to(self.dtype)
        cos, sin = rope_tables(config, model.head_dim, model.max_positions)
        model.rope_cos, model.rope_sin = cos.to(self.device), sin.to(self.device)
        if model.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.load_weights(iter_safetensors(model_dir))
        if self.cpu_packed_linears and self.device.type == "cpu" and self.dtype == torch.float32:
            kernels = cpu_ext.load() if self.cpu_kernels else None
            if kernels is not None or packing_available(self.device, self.dtype):
                pack_linears(model, kernels)
        return model.eval()

    def _default_num_blocks(self, kv_cache_gib):
        c = self.config
        per_block = (2 * c.num_hidden_layers * self.block_size * self.model.num_kv_heads * self.model.head_dim
                     * self.dtype.itemsize)
        if kv_cache_gib is not None:
            budget = kv_cache_gib * 2**30
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = 0.8 * free
        else:
            budget = 4 * 2**30  # zero pages cost nothing until used
        enough = self.max_num_seqs * -(-self.max_model_len // self.block_size)  # every sequence at full length
        return max(1, min(int(budget // per_block), enough))

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

    def make_request(self, prompt, params):
        """Validate and tokenize one request; the returned Sequence is queued by submit()."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"expected SamplingParams, got {type(params).__name__}")
        ids = self.encode(prompt)
        self._check_fits(len(ids))
        self._check_room(min(len(ids) + params.max_tokens, self.max_model_len), "this request")
        seq = Sequence(next(self._ids), ids, params, make_generator(params.seed, self.device))
        seq.start_turn(params, seq.generator)
        return seq

    def make_logits_request(self, prompt):
        ids = self.encode(prompt)
        self._check_fits(len(ids))
        seq = Sequence(next(self._ids), ids, None, logits_only=True)
        seq.start_turn(None, None, logits_only=True)
        return seq

    def submit(self, seq):
        self._stats.totals["requests"] += 1
        self.scheduler.add(seq)

    # -- the step -----------------------------------------------------------------------------------
    def step(self):
        """Run one forward pass over the scheduled batch; return the sequences whose request finished."""
        if not self.scheduler.has_work():
            return []
        start = time.perf_counter()
        preempted_before = self.scheduler.num_preemptions
        batch = self.scheduler.schedule()
        logits, _ = self.runner.run(batch)
        prefill_tokens = decode_tokens = 0
        ended = []
        for seq, n in batch:
            if n == 1 and seq.num_computed >= seq.output_start:
                decode_tokens += 1
            else:
                prefill_tokens += n
            seq.num_computed += n
            if seq.num_computed == len(seq):
                ended.append(seq)
        finished = []
        to_sample = []
        for row, seq in enumerate(ended):
            if seq.logits_only:
                seq.logits = logits[row].cpu()
                seq.finish_reason = "logits"
                finished.append(seq)
            else:
                to_sample.append((row, seq))
        if to_sample:
            rows = torch.tensor([r for r, _ in to_sample], device=logits.device)
            tokens, logprobs = sample(logits.index_select(0, rows), [s for _, s in to_sample])
            for (_, seq), token, lp in zip(to_sample, tokens, logprobs):
                seq.token_ids.append(token)
                if lp is not None:
                    seq.logprobs.append(lp)
                if self._check_stop(seq, token):
                    finished.append(seq)
        for seq in finished:
            self.scheduler.finish(seq)
        self._stats.totals["preemptions"] += self.scheduler.num_preemptions - preempted_before
        cached = self.scheduler.pop_admitted_cached_tokens()
        self._stats.record(start, time.perf_counter() - start, len(batch), prefill_tokens, decode_tokens, cached)
        return finished

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
        for seq in seqs:
            self.submit(seq)
        while any(s.status in (Status.WAITING, Status.RUNNING) for s in seqs):
            self.step()

    # -- public operations --------------------------------------------------------------------------
    def _params_list(self, params, n):
        params = SamplingParams() if params is None else params
        params = list(params) if isinstance(params, (list, tuple)) else [params] * n
        if len(params) != n:
            raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
        return params

    @staticmethod
    def _prompt_list(prompts):
        """A single prompt (a string or a list of ints) or a list of prompts -> a list of prompts."""
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts and
                                        all(isinstance(t, int) for t in prompts)):
            return [prompts]
        return list(prompts)

    def generate(self, prompts, params=None):
        """Generate for each prompt (raw text, no template, or token ids); outputs in prompt order."""
        prompts = self._prompt_list(prompts)
        seqs = [self.make_request(p, sp) for p, sp in zip(prompts, self._params_list(params, len(prompts)))]
        self.run_until_done(seqs)
        return Outputs(self.output(s) for s in seqs)

    def render_chat(self, conversation, untrusted=False, add_generation_prompt=True):
        """Token ids of a conversation under the model's chat template (see chat.render_chat)."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer, so no chat template")
        return render_chat(self.tokenizer, conversation, add_generation_prompt=add_generation_prompt, untrusted=untrusted)

    @staticmethod
    def _conversation_list(conversations):
        if conversations and isinstance(conversations[0], dict):
            return [conversations]
        return list(conversations)

    def chat(self, conversations, params=None, untrusted=False):
        """Generate replies to conversations (lists of {"role", "content"[, "untrusted"]} messages)."""
        conversations = self._conversation_list(conversations)
        return self.generate([self.render_chat(c, untrusted) for c in conversations], params)

    def logits(self, prompts):
        """Next-token logits (fp32, [len(prompts), vocab]) after each prompt or session, in one batched
        forward pass when the prompts fit in max_batch_tokens. Sessions stay where they are."""
        seqs = [self._logits_seq(p) for p in self._prompt_list(prompts)]
        self.run_until_done(seqs)
        return torch.stack([s.logits for s in seqs])

    def _logits_seq(self, prompt):
        if isinstance(prompt, Session):
            self._check_idle(prompt)
            prompt.seq.start_turn(None, None, logits_only=True)
            self._recompute_last(prompt.seq)
            return prompt.seq
        return self.make_logits_request(prompt)

    def candidate_token_ids(self, candidates):
        """The first token of each candidate continuation (tokenized as plain text)."""
        ids = []
        for c in candidates:
            tokens = plain_text_ids(self.tokenizer, c) if isinstance(c, str) else [int(c)]
            if not tokens:
                raise ValueError(f"candidate {c!r} has no tokens")
            ids.append(tokens[0])
        return ids

    def score(self, prompts, candidates):
        """For each prompt, {candidate: log-probability of the candidate's first token as the next token}.

        candidates: one list for every prompt, or one list per prompt. One batched forward pass."""
        prompts = self._prompt_list(prompts)
        return self.logprobs_of(self.logits(prompts), self.candidate_lists(prompts, candidates))

    @staticmethod
    def candidate_lists(prompts, candidates):
        """One candidate list per prompt: `candidates` is shared, or already one list per prompt."""
        per_prompt = candidates if candidates and isinstance(candidates[0], (list, tuple)) else [candidates] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"got {len(per_prompt)} candidate lists for {len(prompts)} prompts")
        return per_prompt

    def logprobs_of(self, logits, per_prompt):
        logprobs = torch.log_softmax(logits, dim=-1)
        return [dict(zip(cands, logprobs[i, self.candidate_token_ids(cands)].tolist()))
                for i, cands in enumerate(per_prompt)]

    # -- sessions -----------------------------------------------------------------------------------
    def open_session(self, prompt):
        """A pinned sequence for round-robin turns; its KV stays cached until close_session."""
        ids = self.encode(prompt)
        self._check_fits(len(ids), "session prompt")
        seq = Sequence(next(self._ids), ids, None, pinned=True, status=Status.IDLE)
        return Session(seq)

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

    def make_turn(self, session, params):
        self._check_idle(session)
        seq = session.seq
        self._check_room(min(len(seq) + params.max_tokens, self.max_model_len), f"{session}")
        seq.start_turn(params, make_generator(params.seed, self.device))
        self._recompute_last(seq)
        return seq

    @staticmethod
    def _recompute_last(seq):
        # Every token computed (after a logits call): recompute the last one to get its logits again.
        if seq.num_computed == len(seq):
            seq.num_computed -= 1
            seq.turn_start = seq.num_computed

    def continue_(self, sessions, params=None):
        """Generate from where each session stands, keeping the KV; the tokens join the session."""
        sessions = [sessions] if isinstance(sessions, Session) else list(sessions)
        seqs = [self.make_turn(s, p) for s, p in zip(sessions, self._params_list(params, len(sessions)))]
        self.run_until_done(seqs)
        return Outputs(self.output(s) for s in seqs)

    def close_session(self, session):
        if session.seq.status is Status.CLOSED:
            return
        if session.seq.status is not Status.IDLE:
            raise ValueError(f"{session} has a request in flight")
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
