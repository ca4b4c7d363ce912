"""The LM head: vocab-parallel, tied to the embedding when the config says so, untied again when the
checkpoint ships a head that differs from the embedding (as transformers does). The model holds it as
`lm_head` beside `model.embed_tokens`, the names the checkpoints use."""
import torch
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


def untie_if_different(model, head):
    """A config that ties the head, with a checkpoint that ships one (`head`, whole) different from the
    embedding (Mistral 3's outer config defaults to tied): the head is the model's own."""
    from ..weights import rank_slice
    embed = model.model.embed_tokens.weight
    head = rank_slice(head, parallel.VOCAB, embed.shape).to(embed.device, embed.dtype)
    if not torch.equal(head, embed):
        model.lm_head.weight = nn.Parameter(head, requires_grad=False)
        model.tie_word_embeddings = False
