"""Builds one step's batch tensors (token ids, positions, slot mapping, block tables) and runs the model.

Rows of a step are ordered decodes first (one token each, paged decode kernel), then prefill chunks
(append-prefill kernel: new tokens attend to their cached prefix plus themselves).
"""
from dataclasses import dataclass

import torch

from ..kernels import attention_ops


@dataclass
class AttentionMetadata:
    ops: object  # the attention backend module
    slot_mapping: torch.Tensor  # [T] cache slot of every new token
    num_decode: int  # the first num_decode rows are single-token decodes
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

    def prepare(self, batch):
        """batch: [(seq, num_new_tokens)], decodes (n == 1) first. Returns (input_ids, positions, meta,
        logit_rows) where logit_rows are the packed indices of rows whose last token is the sequence's end."""
        bs = self.block_size
        input_ids, positions, slots, logit_rows = [], [], [], []
        for seq, n in batch:
            start = seq.num_computed
            input_ids.extend(seq.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            if start + n == len(seq):
                logit_rows.append(len(input_ids) - 1)
        num_decode = sum(1 for _, n in batch if n == 1)
        decode = [s for s, _ in batch[:num_decode]]
        prefill = batch[num_decode:]
        cu = [0]
        for _, n in prefill:
            cu.append(cu[-1] + n)
        meta = AttentionMetadata(
            ops=self.ops,
            slot_mapping=self._tensor(slots),
            num_decode=num_decode,
            decode_seq_lens=self._tensor([s.num_computed + 1 for s in decode], torch.int32) if decode else None,
            decode_block_tables=self._block_tables(decode) if decode else None,
            cu_seqlens_q=self._tensor(cu, torch.int32) if prefill else None,
            prefill_seq_lens=self._tensor([s.num_computed + n for s, n in prefill], torch.int32) if prefill else None,
            prefill_block_tables=self._block_tables([s for s, _ in prefill]) if prefill else None,
        )
        return self._tensor(input_ids), self._tensor(positions), meta, logit_rows

    @torch.inference_mode()
    def run(self, batch):
        """One forward pass over the batch; returns fp32 logits for the rows that end their sequence."""
        input_ids, positions, meta, logit_rows = self.prepare(batch)
        hidden = self.model(input_ids, positions, meta, self.kv_cache)
        if not logit_rows:
            return None, logit_rows
        return self.model.compute_logits(hidden.index_select(0, self._tensor(logit_rows))), logit_rows
