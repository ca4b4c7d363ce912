"""Builds one forward pass's tensors (token ids, positions, slot mapping, block tables) and runs the model.

The rows (sequence.Row) are packed single-token rows first (decodes, and one-token prefills: the paged
decode kernel computes them), then the longer chunks (append-prefill kernel: new tokens attend to their
cached prefix plus themselves). The runner alone says which logits row belongs to which sequence.
"""
from dataclasses import dataclass

import torch

from ..kernels import attention_ops


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


class ModelRunner:
    def __init__(self, model, kv_cache, block_size, device, attention_backend="auto"):
        self.model, self.kv_cache, self.block_size, self.device = model, kv_cache, block_size, device
        self.ops = attention_ops(attention_backend, device)

    def _tensor(self, values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _block_tables(self, seqs):
        width = max(len(s.block_table) for s in seqs)
        return self._tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], torch.int32)

    def prepare(self, rows):
        """Returns (input_ids, positions, meta, logit_rows, seqs): logit_rows are the packed indices of the
        rows that end their sequence, seqs those sequences, in the same order."""
        rows = sorted(rows, key=lambda row: row.num_tokens > 1)  # stable: single-token rows first
        bs = self.block_size
        input_ids, positions, slots, logit_rows, seqs = [], [], [], [], []
        for row in rows:
            seq, start, end = row.seq, row.start, row.end
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if row.ends_sequence:
                logit_rows.append(len(input_ids) - 1)
                seqs.append(seq)
        num_decode = sum(1 for row in rows if row.num_tokens == 1)
        decode, prefill = rows[:num_decode], rows[num_decode:]
        cu = [0]
        for row in prefill:
            cu.append(cu[-1] + row.num_tokens)
        meta = AttentionMetadata(
            ops=self.ops,
            slot_mapping=self._tensor(slots),
            num_decode=num_decode,
            decode_seq_lens=self._tensor([r.end for r in decode], torch.int32) if decode else None,
            decode_block_tables=self._block_tables([r.seq for r in decode]) if decode else None,
            cu_seqlens_q=self._tensor(cu, torch.int32) if prefill else None,
            prefill_seq_lens=self._tensor([r.end for r in prefill], torch.int32) if prefill else None,
            prefill_block_tables=self._block_tables([r.seq for r in prefill]) if prefill else None,
        )
        return self._tensor(input_ids), self._tensor(positions), meta, logit_rows, seqs

    @torch.inference_mode()
    def run(self, rows):
        """One forward pass over the rows; returns (seqs, logits): the sequences that a row ends and their
        next-token logits (fp32, one row each, None when there are none)."""
        input_ids, positions, meta, logit_rows, seqs = self.prepare(rows)
        hidden = self.model(input_ids, positions, meta, self.kv_cache)
        if not logit_rows:
            return seqs, None
        return seqs, self.model.compute_logits(hidden.index_select(0, self._tensor(logit_rows)))
