"""Builds one forward pass's tensors (token ids, positions, slot mapping, block tables) and runs the model.

The rows (sequence.Row) are packed single-token rows first (decodes, and one-token prefills: the paged
decode kernel computes them), then the longer chunks (append-prefill kernel: new tokens attend to their
cached prefix plus themselves). The runner alone says which logits row belongs to which sequence.

On CUDA a step's integers are written with numpy into one preallocated pinned host buffer and reach the
GPU in one non-blocking copy (StepBuffers: no tensor built from a list, no pageable copy), and steps of
single-token rows replay CUDA graphs (cuda_graphs.py). On the CPU the tensors are built from lists.
"""
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from ..kernels import attention_ops
from . import prompt_logprobs
from .cuda_graphs import DecodeGraphs, FixedSplits


@dataclass
class AttentionMetadata:
    ops: object  # the attention backend module
    slot_mapping: torch.Tensor  # [T] cache slot of every new token
    num_decode: int  # the first num_decode rows are single-token rows (the decode kernel's)
    decode_seq_lens: torch.Tensor | None  # [D]
    decode_block_tables: torch.Tensor | None  # [D, max_blocks]
    cu_seqlens_q: torch.Tensor | None  # [P + 1] over the prefill rows
    prefill_seq_lens: torch.Tensor | None  # [P]
    prefill_block_tables: torch.Tensor | None  # [P, max_blocks]
    logit_index: torch.Tensor | None = None  # the logit rows on the device (StepBuffers); the runner's, not the model's
    prefill_max_lens: tuple | None = None  # (longest new-token run, longest sequence) of the prefill rows, host ints


def device_guard(device):
    """The device current for the block: torch ops follow their tensors, but a Triton launch runs in
    the current device's context, so an engine on cuda:1 must make cuda:1 current around its step."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


@dataclass
class StepPlan:
    """A step's inputs as plain lists, rows ordered decode rows first."""
    input_ids: list = field(default_factory=list)
    positions: list = field(default_factory=list)
    slot_mapping: list = field(default_factory=list)  # the cache slot of every new token
    logit_rows: list = field(default_factory=list)  # the packed rows whose logits are wanted
    decode_lens: list = field(default_factory=list)  # per single-token row: its sequence's length
    decode_tables: list = field(default_factory=list)  # ... and block table
    prefill_tokens: list = field(default_factory=list)  # per longer row: its new tokens
    prefill_lens: list = field(default_factory=list)
    prefill_tables: list = field(default_factory=list)

    def max_lens(self):
        """What flash-attn sizes its grid with, known here on the host (reading it from the device would
        sync once a layer)."""
        return (max(self.prefill_tokens), max(self.prefill_lens)) if self.prefill_lens else None


_I64, _I32 = np.dtype(np.int64), np.dtype(np.int32)
_TORCH = {_I64: torch.int64, _I32: torch.int32}


def layout(num_tokens, num_decode, num_prefill, decode_width, prefill_width, num_logits):
    """Where each field of a step sits in StepBuffers: {name: (byte offset, count, dtype)}, and the bytes
    used. Fields follow one another (each aligned to its dtype), so the offsets depend only on the sizes:
    a graphed step of B rows always has the same layout."""
    fields, end = {}, 0
    for name, count, dtype in (
            ("input_ids", num_tokens, _I64), ("positions", num_tokens, _I64), ("slot_mapping", num_tokens, _I64),
            ("decode_seq_lens", num_decode, _I32), ("decode_block_tables", num_decode * decode_width, _I32),
            ("cu_seqlens_q", num_prefill + 1 if num_prefill else 0, _I32), ("prefill_seq_lens", num_prefill, _I32),
            ("prefill_block_tables", num_prefill * prefill_width, _I32), ("logit_index", num_logits, _I64)):
        start = -(-end // dtype.itemsize) * dtype.itemsize
        fields[name] = (start, count, dtype)
        end = start + count * dtype.itemsize
    return fields, end


class StepBuffers:
    """A step's integers: written with numpy into a pinned host buffer, sent in one non-blocking copy to a
    device buffer of the same size, handed out as views of it. Sized for the largest step
    (max_tokens tokens, max_seqs rows, tables max_blocks wide); a step that does not fit is not staged."""

    def __init__(self, max_tokens, max_seqs, max_blocks, device, pin=True):
        self.max_blocks, self.device, self.pinned = max_blocks, torch.device(device), pin
        # Rows are at most max_seqs in all, decode and prefill together; 64 bytes of alignment slack.
        self.nbytes = layout(max_tokens, max_seqs, max_seqs, max_blocks, 0, max_seqs)[1] + 64
        self.host = torch.zeros(self.nbytes, dtype=torch.uint8, pin_memory=pin)
        self.host_np = self.host.numpy()
        self.device_buffer = torch.zeros(self.nbytes, dtype=torch.uint8, device=self.device)
        # The last copy, recorded: the host buffer is rewritten only once it has been read (a step
        # without logits never syncs, so the GPU may still be behind).
        self.copied = torch.cuda.Event() if self.device.type == "cuda" else None
        self.pending = False

    def send(self, values, decode_width, prefill_width):
        """values: {field: list of ints}, the block tables as lists of rows. A table field is [rows, width]
        (a graphed step: max_blocks wide and more rows than tables, the padding rows); its entries are
        zeroed up to the longest table, the rest keep whatever they held (no kernel reads past a
        sequence's length; the torch reference reads up to the longest one). Returns {field: device
        tensor} for the non-empty fields, or None when the step does not fit."""
        num_decode, num_prefill = len(values["decode_seq_lens"]), len(values["prefill_seq_lens"])
        fields, end = layout(len(values["input_ids"]), num_decode, num_prefill, decode_width, prefill_width,
                             len(values["logit_index"]))
        if end > self.nbytes or max(decode_width, prefill_width) > self.max_blocks:
            return None
        if self.pending:
            self.copied.synchronize()
        for name, (start, count, dtype) in fields.items():
            if not count:
                continue
            view = self.host_np[start:start + count * dtype.itemsize].view(dtype)
            if name.endswith("block_tables"):
                width = decode_width if name == "decode_block_tables" else prefill_width
                view = view.reshape(-1, width)
                view[:, :max((len(t) for t in values[name]), default=0)] = 0
                for row, table in zip(view, values[name]):
                    row[:len(table)] = table
            else:
                view[:] = values[name]
        self.device_buffer[:end].copy_(self.host[:end], non_blocking=self.pinned)
        if self.copied is not None:
            self.copied.record(torch.cuda.current_stream(self.device))  # the copy's stream, on this device
            self.pending = True
        out = {}
        for name, (start, count, dtype) in fields.items():
            if count:
                tensor = self.device_buffer[start:start + count * dtype.itemsize].view(_TORCH[dtype])
                if name.endswith("block_tables"):
                    tensor = tensor.view(-1, decode_width if name == "decode_block_tables" else prefill_width)
                out[name] = tensor
        return out


def eager_reason(config, ops, cuda_graphs):
    """Why a CUDA runner's single-token steps run eagerly, or None when they replay CUDA graphs. The engine
    asks for no graphs under enforce_eager and under tensor parallelism (they would capture the collectives)."""
    if config.enforce_eager:
        return "eager (enforce_eager)"
    if not cuda_graphs:
        return "eager (tensor parallelism)"
    if not ops.__name__.endswith("triton_ops"):
        return "eager (CUDA graphs need attention_backend='triton')"
    return None


class ModelRunner:
    def __init__(self, model, kv_cache, config, cuda_graphs=False):
        """config: the engine's resolved EngineConfig (config.resolve, fit_to_model, and the attention backend
        the engine chose: a backend's name, never "auto"). The runner runs where its pool is (a tensor-parallel
        rank's own device). On CUDA, steps are staged in StepBuffers sized by the config's limits; with
        cuda_graphs too (and the Triton backend), single-token steps replay CUDA graphs."""
        self.model, self.kv_cache, self.block_size, self.device = model, kv_cache, config.block_size, kv_cache.device
        self.ops = attention_ops(config.attention_backend)  # the engine's choice, looked up: no choosing here
        self.buffers = self.graphs = None
        self.peers = None  # tensor parallelism: the other ranks (tensor_parallel.Peers), told every step
        if self.device.type != "cuda":
            self.graphs_off = f"eager ({self.device.type})"
        else:
            self.graphs_off = eager_reason(config, self.ops, cuda_graphs)
            self.stage(config.max_num_seqs, config.max_batch_tokens, config.max_model_len,
                       cuda_graphs=self.graphs_off is None)

    def stage(self, max_num_seqs, max_batch_tokens, max_model_len, cuda_graphs, pin=True):
        """Build steps in StepBuffers, and with cuda_graphs replay single-token steps as CUDA graphs: what
        __init__ sets up on CUDA with the config's limits (tests set it up on the CPU, unpinned, with a
        stand-in for capture)."""
        max_blocks = -(-max_model_len // self.block_size)
        self.buffers = StepBuffers(max(max_batch_tokens, max_num_seqs), max_num_seqs, max_blocks, self.device, pin)
        if cuda_graphs:
            self.graphs = DecodeGraphs(max_num_seqs, max_blocks, self.device)
        self.graph_ops = FixedSplits(self.ops, max_model_len)  # eager steps too: the graphs' split counts

    def describe(self):
        """Whether decode steps replay CUDA graphs, at which buckets, which are captured so far."""
        if self.graphs is None:
            return {"enabled": False, "off_reason": self.graphs_off}
        return self.graphs.describe()

    def _tensor(self, values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _block_tables(self, tables):
        width = max(len(t) for t in tables)
        return self._tensor([t + [0] * (width - len(t)) for t in tables], torch.int32)

    def plan(self, rows):
        """(StepPlan, seqs, asked): the step as plain lists (what every tensor-parallel rank builds its tensors
        from), the sequences its logit rows belong to, and the (seq, position) of each logit row after those:
        the positions whose logits give prompt log-probabilities (prompt_logprobs.py)."""
        rows = sorted(rows, key=lambda row: row.num_tokens > 1)  # stable: single-token rows first
        bs = self.block_size
        step, seqs, asked, asked_rows = StepPlan(), [], [], []
        for row in rows:
            seq, start, end = row.seq, row.start, row.end
            offset = len(step.input_ids) - start
            for p in prompt_logprobs.positions(row):  # after the step's own logit rows (see run)
                asked.append((seq, p))
                asked_rows.append(offset + p)
            step.input_ids.extend(seq.token_ids[start:end] if row.token is None else (row.token,))
            step.positions.extend(range(start, end))
            table = seq.block_table
            step.slot_mapping.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if row.ends_sequence or row.verify:
                step.logit_rows.append(len(step.input_ids) - 1)
                seqs.append(seq)
            if row.num_tokens == 1:
                step.decode_lens.append(end)
                step.decode_tables.append(table)
            else:
                step.prefill_tokens.append(row.num_tokens)
                step.prefill_lens.append(end)
                step.prefill_tables.append(table)
        step.logit_rows += asked_rows
        return step, seqs, asked

    def prepare(self, rows, pad_to=None):
        """Returns (input_ids, positions, meta, logit_rows, seqs): logit_rows are the packed indices of the
        rows that end their sequence or verify drafts (a sequence's rows in order), seqs their sequences.

        pad_to (a graphed step: single-token rows, StepBuffers): add padding rows up to that many, with
        slot -1 and length 0, and block tables max_blocks wide."""
        step, seqs, _ = self.plan(rows)
        return (*self.tensors(step, pad_to), step.logit_rows, seqs)

    def tensors(self, step, pad_to=None):
        """(input_ids, positions, meta) of a StepPlan, on the device."""
        cu = [0]
        for n in step.prefill_tokens:
            cu.append(cu[-1] + n)
        if self.buffers is not None:
            staged = self._stage(step, cu, pad_to)
            if staged is not None:
                return staged
        if pad_to is not None:
            raise ValueError("pad_to needs the staged (CUDA) path and a step that fits its buffers")
        decode, prefill = step.decode_lens, step.prefill_lens
        meta = AttentionMetadata(
            ops=self.ops,
            slot_mapping=self._tensor(step.slot_mapping),
            num_decode=len(decode),
            decode_seq_lens=self._tensor(decode, torch.int32) if decode else None,
            decode_block_tables=self._block_tables(step.decode_tables) if decode else None,
            cu_seqlens_q=self._tensor(cu, torch.int32) if prefill else None,
            prefill_seq_lens=self._tensor(prefill, torch.int32) if prefill else None,
            prefill_block_tables=self._block_tables(step.prefill_tables) if prefill else None,
            prefill_max_lens=step.max_lens(),
        )
        return self._tensor(step.input_ids), self._tensor(step.positions), meta

    def _stage(self, step, cu, pad_to):
        """The step through StepBuffers: (input_ids, positions, meta), or None when it does not fit."""
        input_ids, positions, slots = step.input_ids, step.positions, step.slot_mapping
        decode_lens, decode_tables = step.decode_lens, step.decode_tables
        decode_width = max((len(t) for t in decode_tables), default=0)
        if pad_to is not None:
            if step.prefill_lens or pad_to < len(decode_lens):
                raise ValueError(f"pad_to={pad_to} is for a step of at most {pad_to} single-token rows")
            pad = pad_to - len(decode_lens)
            input_ids, positions, slots = input_ids + [0] * pad, positions + [0] * pad, slots + [-1] * pad
            decode_lens = decode_lens + [0] * pad
            decode_width = self.buffers.max_blocks
        prefill_width = max((len(t) for t in step.prefill_tables), default=0)
        t = self.buffers.send({"input_ids": input_ids, "positions": positions, "slot_mapping": slots,
                               "decode_seq_lens": decode_lens, "decode_block_tables": decode_tables,
                               "cu_seqlens_q": cu if step.prefill_lens else [], "prefill_seq_lens": step.prefill_lens,
                               "prefill_block_tables": step.prefill_tables, "logit_index": step.logit_rows},
                              decode_width, prefill_width)
        if t is None:
            return None
        meta = AttentionMetadata(
            ops=self.graph_ops,
            slot_mapping=t["slot_mapping"], num_decode=len(decode_lens),
            decode_seq_lens=t.get("decode_seq_lens"), decode_block_tables=t.get("decode_block_tables"),
            cu_seqlens_q=t.get("cu_seqlens_q"), prefill_seq_lens=t.get("prefill_seq_lens"),
            prefill_block_tables=t.get("prefill_block_tables"), logit_index=t.get("logit_index"),
            prefill_max_lens=step.max_lens())
        return t["input_ids"], t["positions"], meta

    @torch.inference_mode()
    def run(self, rows):
        """One forward pass over the rows; returns (seqs, logits): the sequences that a row ends and their
        next-token logits (fp32, one row each, None when there are none); a sequence with draft rows comes
        once per row, in position order. Under tensor parallelism the other ranks get the plan first."""
        step, seqs, asked = self.plan(rows)
        bucket = self.graphs.bucket(rows) if self.graphs is not None else None
        if self.peers is not None:
            logits = self.peers.together("run", step, lambda: self.execute(step, bucket))
        else:
            logits = self.execute(step, bucket)
        if asked:  # the prompt rows come last: they go to their sequences, the rest to the engine
            prompt_logprobs.record(asked, logits[len(seqs):])
            logits = logits[:len(seqs)] if seqs else None
        return seqs, logits

    @torch.inference_mode()
    def execute(self, step, bucket=None):
        """The forward pass of a StepPlan: the logits of its logit rows (None when it has none)."""
        input_ids, positions, meta = self.tensors(step, pad_to=bucket)
        with device_guard(self.device):  # Triton launches on the current device, not the tensors'
            return self._forward(bucket, input_ids, positions, meta, step.logit_rows)

    def copy_block(self, src, dst):
        """Copy a KV block (a rider parting from its leader's last block), on every rank."""
        copy = lambda: self.kv_cache[:, :, dst].copy_(self.kv_cache[:, :, src])  # noqa: E731
        if self.peers is not None:
            self.peers.together("copy_block", (src, dst), copy)
        else:
            copy()

    def _forward(self, bucket, input_ids, positions, meta, logit_rows):
        forward = lambda: self.model(input_ids, positions, meta, self.kv_cache)  # noqa: E731
        if bucket is None:
            hidden = forward()
        else:
            inputs = (input_ids, positions, meta.slot_mapping, meta.decode_seq_lens, meta.decode_block_tables)
            hidden = self.graphs.run(bucket, forward, tuple(t.data_ptr() for t in inputs))
        if not logit_rows:
            return None
        index = meta.logit_index if meta.logit_index is not None else self._tensor(logit_rows)
        return self.model.compute_logits(hidden.index_select(0, index))
