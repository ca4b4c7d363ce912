"""Prompt log-probabilities: each prompt token's log-probability given the tokens before it, with the top
k of its position, computed in the prefill that computes the prompt's K/V (what lm-eval's log-likelihood
tasks and vLLM's `prompt_logprobs` / `echo` ask for).

A request asks for them from a position on (`Sequence.prompt_logprobs_from`, 1 for the whole prompt: the
first token has none). The logits of position p give token p + 1, so positions from `from - 1` on must be
computed, not read from the prefix cache: the scheduler caps a prefix-cache hit there. A log-likelihood
request (context, continuation) asks from the continuation on, so the context's blocks still come from the
cache and are shared by its continuations; an echo request asks from 1 and skips the cache.
Such a request never rides on an identical one's row (the rider would get no prompt rows of its own).
"""
import torch


def start(seq, k, first=1):
    """Ask `seq` (a new request, its prompt = all its tokens) for its prompt's log-probabilities from
    position `first` on, each with the top k of its position."""
    if not 1 <= first <= len(seq.token_ids):
        raise ValueError(f"prompt log-probabilities from token {first}: the prompt has {len(seq.token_ids)} "
                         f"tokens and the first has none")
    seq.prompt_logprobs_from, seq.prompt_logprobs_k = first, k
    seq.prompt_logprobs = [None] * len(seq.token_ids)


def positions(row):
    """The positions of a prefill row whose logits give a prompt token's log-probability."""
    seq = row.seq
    if seq.prompt_logprobs_from is None or row.token is not None:
        return range(0)
    return range(max(row.start, seq.prompt_logprobs_from - 1), min(row.end, seq.output_start - 1))


def cache_cap(seq, block_size):
    """How many prefix-cache blocks `seq` may take: none past the first position it needs logits of."""
    if seq.prompt_logprobs_from is None:
        return None
    return (seq.prompt_logprobs_from - 1) // block_size


def record(asked, logits):
    """asked: [(seq, position)], one per row of logits (fp32 [len(asked), vocab]). Each seq's entry for
    token position + 1 becomes {token id: log-prob}: the top k of the position, then the prompt token."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor([seq.token_ids[p + 1] for seq, p in asked], device=logprobs.device)
    chosen = logprobs.gather(1, targets[:, None])[:, 0].tolist()
    k = max(seq.prompt_logprobs_k for seq, _ in asked)
    top_values, top_ids = (torch.topk(logprobs, k, dim=-1) if k else (None, None))
    top_values = top_values.tolist() if k else None
    top_ids = top_ids.tolist() if k else None
    for i, (seq, p) in enumerate(asked):
        kept = seq.prompt_logprobs_k
        entry = dict(zip(top_ids[i][:kept], top_values[i][:kept])) if kept else {}
        entry[seq.token_ids[p + 1]] = chosen[i]
        seq.prompt_logprobs[p + 1] = entry
