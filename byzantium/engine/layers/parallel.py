"""Tensor parallelism inside a model: which rank this process is, how sizes split, the two collectives a
forward pass needs, and the marks that say how each weight is cut.

A model is built with the group current (set_group before building, tensor_parallel.py does it on every
rank): its sizes are then this rank's. The cuts, as in Megatron-LM:
- column-parallel linears (q/k/v, gate/up, the LM head) hold a slice of the output rows; their outputs
  stay split (heads, intermediate channels, vocabulary);
- row-parallel linears (o_proj, down_proj) hold a slice of the input columns; their partial outputs are
  summed over ranks (all_reduce) and their bias is held by rank 0 only, so the sum adds it once;
- the embedding holds a slice of the vocabulary (vocab_parallel); a token outside it embeds as zeros
  and the sum over ranks gives every row once;
- experts of a MoE block are dealt out to ranks whole; the block's output is summed over ranks.
K/V heads are split like query heads; when there are more ranks than K/V heads, each rank keeps the
one K/V head its query heads read (replicated).
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Group:
    rank: int = 0
    size: int = 1
    group: object = None  # the torch.distributed process group; None with one rank


_current = Group()


def current():
    return _current


def set_group(group):
    global _current
    _current = group


def split(total, what):
    """This rank's share of `total` (heads, channels, experts), or a ValueError naming `what`."""
    size = _current.size
    if total % size:
        raise ValueError(f"tensor_parallel_size={size} does not divide {what} ({total})")
    return total // size


def kv_heads_per_rank(num_kv_heads, num_heads):
    """K/V heads this rank holds: its share, or one replicated head when ranks outnumber K/V heads."""
    size = _current.size
    split(num_heads, "the attention heads")
    if size <= num_kv_heads:
        return split(num_kv_heads, "the key/value heads")
    if size % num_kv_heads:
        raise ValueError(f"tensor_parallel_size={size} is neither a divisor nor a multiple of the key/value heads "
                         f"({num_kv_heads})")
    return 1


def vocab_per_rank(vocab_size):
    """Vocabulary rows per rank (the last rank's slice is padded)."""
    return -(-vocab_size // _current.size)


def experts_of_rank(num_experts):
    """The expert ids this rank holds: a contiguous share."""
    per_rank = split(num_experts, "the experts")
    return range(_current.rank * per_rank, (_current.rank + 1) * per_rank)


def all_reduce(x):
    """Sum x over the ranks, in place (one rank: x itself)."""
    if _current.size > 1:
        dist.all_reduce(x, group=_current.group)
    return x


def gather_last(x):
    """Concatenate every rank's x along the last dimension (one rank: x itself)."""
    if _current.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_current.size)]
    dist.all_gather(parts, x.contiguous(), group=_current.group)
    return torch.cat(parts, dim=-1)


# -- how each weight is cut (read by engine/weights.py when a checkpoint tensor is copied in) ---------------

COLUMN, ROW, VOCAB, FIRST_RANK = "column", "row", "vocab", "first rank"


def column(linear):
    """Mark a linear as column-parallel (its weight and bias are cut along the output rows)."""
    linear.weight.tp_cut = COLUMN
    if linear.bias is not None:
        linear.bias.tp_cut = COLUMN
    return linear


def row(linear):
    """Mark a linear as row-parallel (its weight is cut along the input columns; rank 0 holds the bias)."""
    linear.weight.tp_cut = ROW
    if linear.bias is not None:
        linear.bias.tp_cut = FIRST_RANK
    return linear


def vocab_parallel(param):
    """Mark an embedding (or an untied LM head) as cut along the vocabulary, padded to vocab_per_rank rows."""
    param.tp_cut = VOCAB
    return param


def cut_of(param):
    return getattr(param, "tp_cut", None)


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, vocab_size, hidden_size):
        super().__init__()
        self.vocab_size, self.rows = vocab_size, vocab_per_rank(vocab_size)
        self.start = _current.rank * self.rows
        self.weight = vocab_parallel(torch.nn.Parameter(torch.empty(self.rows, hidden_size)))

    def forward(self, input_ids):
        if _current.size == 1:
            return torch.nn.functional.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.rows)
        x = torch.nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))


def vocab_logits(lm_head, hidden, vocab_size):
    """Full-vocabulary logits (fp32) from a vocab-parallel LM head: every rank's slice, gathered."""
    return gather_last(lm_head(hidden).float())[..., :vocab_size]
