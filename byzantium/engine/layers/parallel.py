"""Tensor parallelism inside a model: which rank this process is, how sizes split, the two collectives a
forward pass needs, and the marks that say how each weight is cut.

A model is built inside `using(group)` (tensor_parallel.py does it on every rank): its sizes are then
this rank's, and each module that sums over ranks keeps the group it was built with (another engine in
the same process, built outside it, stays whole). The cuts, as in Megatron-LM (marked on the modules, read by weights.copy_weight):
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
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class Group:
    rank: int = 0
    size: int = 1
    backend: object = None  # this engine's own process group (tensor_parallel.py sets it once all ranks joined)


_current = Group()


def current():
    return _current


@contextmanager
def using(group):
    """Build a model's slice for `group` (its rank and size) inside this block."""
    global _current
    before, _current = _current, group
    try:
        yield group
    finally:
        _current = before


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


def all_reduce(x, group):
    """Sum x over the group's ranks, in place (one rank: x itself)."""
    if group.size > 1:
        group.backend.allreduce([x]).wait()
    return x


def gather_last(x, group):
    """Concatenate every rank's x along the last dimension (one rank: x itself)."""
    if group.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(group.size)]
    group.backend.allgather([parts], [x.contiguous()]).wait()
    return torch.cat(parts, dim=-1)


# -- how each weight is cut (read by engine/weights.py when a checkpoint tensor is copied in) ---------------

COLUMN, ROW, VOCAB, FIRST_RANK = "column", "row", "vocab", "first rank"


# The marks live on the modules (a parameter made anew by to_empty would lose an attribute of its own).

def column(linear):
    """Mark a linear as column-parallel (its weight and bias are cut along the output rows)."""
    linear.tp_cuts = {"weight": COLUMN, "bias": COLUMN}
    return linear


def row(linear):
    """Mark a linear as row-parallel (its weight is cut along the input columns; rank 0 holds the bias)."""
    linear.tp_cuts = {"weight": ROW, "bias": FIRST_RANK}
    return linear


def vocab_parallel(module):
    """Mark an embedding (or an untied LM head) as cut along the vocabulary, padded to vocab_per_rank rows."""
    module.tp_cuts = {"weight": VOCAB}
    return module


def cut_of(model, name):
    """How parameter `name` of `model` is cut (None: whole on every rank)."""
    owner, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(owner), "tp_cuts", {}).get(attr)


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, vocab_size, hidden_size):
        super().__init__()
        self.tp = _current
        self.vocab_size, self.rows = vocab_size, vocab_per_rank(vocab_size)
        self.start = self.tp.rank * self.rows
        self.weight = torch.nn.Parameter(torch.empty(self.rows, hidden_size))
        vocab_parallel(self)

    def forward(self, input_ids):
        if self.tp.size == 1:
            return torch.nn.functional.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.rows)
        x = torch.nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(x.masked_fill(outside.unsqueeze(-1), 0), self.tp)


def vocab_logits(lm_head, hidden, vocab_size, group):
    """Full-vocabulary logits (fp32) from a vocab-parallel LM head: every rank's slice, gathered."""
    return gather_last(lm_head(hidden).float(), group)[..., :vocab_size]
