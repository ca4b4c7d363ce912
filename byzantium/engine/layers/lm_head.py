"""The LM head: vocab-parallel, tied to the embedding when the config says so, untied again when the
checkpoint ships a head that differs from the embedding (as transformers does; weights.py unties it at
load). The model holds it as
`lm_head` beside `model.embed_tokens`, the names the checkpoints use."""
from torch import nn

from . import parallel


def add_lm_head(model, hidden_size, vocab_size, tie):
    """Give `model` its `lm_head` ([this rank's vocabulary rows, hidden], tied to model.model.embed_tokens
    when `tie`) and its `tie_word_embeddings`."""
    model.tie_word_embeddings = bool(tie)
    model.lm_head = parallel.vocab_parallel(nn.Linear(hidden_size, parallel.vocab_per_rank(vocab_size), bias=False))
    retie(model)


def retie(model):
    """Point a tied head at the embedding again (after to_empty, which makes new parameters)."""
    if model.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight

