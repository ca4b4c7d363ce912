"""Prompt-lookup speculation: draft tokens copied from a request's own context, checked in one step.

A decoding request whose newest tokens (an n-gram, n from max_n down to min_n) occurred earlier in its
prompt or output proposes the tokens that followed that occurrence, at most `num_tokens` of them. The
step feeds them after its newest token as single-token rows (Row.token), each one a decode query over
the context before it, exactly as a step of plain decoding would compute it, and takes every row's
logits. Sampling then goes row after row with the request's own noise for that position
(sampling/noise.py: a request's i-th token races its logits against noise hashed from its key and i)
and keeps a draft token only while it is the token sampled there (sampling/append.py). So the tokens are the ones decoding one
at a time would have produced, at any temperature, and a step yields 1 to num_tokens + 1 of them. A
request with a structured-output grammar samples each row from its grammar's mask, its matcher advanced
through the tokens kept before that row (grammar.py), so its drafts need no rollback either.
Rejected drafts leave K/V past the sequence's computed length, which its next tokens overwrite; their
blocks are never hashed into the prefix cache.

It pays where a step costs what reading the weights costs (few rows a step: small batches on a CPU,
most decode steps on a GPU), and repetitive text (judges restating the problem, refinements copying an
answer, a small model's loops) is what it drafts well. A step's draft rows are capped (`max_rows`, all
rows of the step counted), so that a step whose rows already make it compute-bound does not grow.

Here: proposing drafts (PromptLookup, draft_tokens), the rows of a speculative step (speculative_rows),
and after the pass the drafts each request was fed and the rows wasted (StepDrafts); the sampling loop
that keeps drafts while they match is sampling/append.py's.
"""
from .sequence import Row


class PromptLookup:
    def __init__(self, num_tokens, max_rows, min_n=3, max_n=4):
        if num_tokens < 1 or max_rows < 1 or not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup needs num_tokens >= 1, max_rows >= 1, 1 <= min_n <= max_n; got "
                             f"{num_tokens}, {max_rows}, {min_n}, {max_n}")
        self.num_tokens, self.max_rows, self.min_n, self.max_n = num_tokens, max_rows, min_n, max_n

    def propose(self, seq, k):
        """Up to k tokens that followed the latest earlier occurrence of seq's newest n-gram ([] if none)."""
        tokens, index = seq.token_ids, seq.ngrams
        if seq.ngrams_upto > len(tokens) - 1:  # the tokens were replaced: index them again
            index.clear()
            seq.ngrams_upto = 0
        # Index every n-gram that ends before the newest token (so a continuation follows it), latest wins.
        for end in range(seq.ngrams_upto + 1, len(tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                index[tuple(tokens[end - n:end])] = end
        seq.ngrams_upto = max(seq.ngrams_upto, len(tokens) - 1)
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            end = index.get(tuple(tokens[len(tokens) - n:]))
            if end is not None:
                return tokens[end:end + k]
        return []

    def describe(self):
        return {"method": "prompt lookup (n-gram)", "num_speculative_tokens": self.num_tokens,
                "max_rows": self.max_rows, "min_n": self.min_n, "max_n": self.max_n}


def draft_tokens(drafter, seq, k, max_model_len, blocks):
    """A decoding request's draft tokens for this step: at most k, none past its max_tokens or the model's
    length, none its structured-output grammar refuses (grammar.py: such a draft could never equal the
    token sampled from the grammar's mask), and only if their blocks are free (drafts never preempt anyone)."""
    k = min(k, drafter.num_tokens, seq.params.max_tokens - seq.num_output - 1,
            (max_model_len or len(seq) + k + 1) - len(seq) - 1)
    drafts = drafter.propose(seq, k) if k > 0 else []
    grammar = getattr(seq, "grammar", None)
    if drafts and grammar is not None:
        drafts = drafts[:grammar.valid_prefix(drafts)]
    if drafts and blocks.blocks_needed(seq, len(seq) + len(drafts)) > blocks.num_free:
        return []
    return drafts


def speculative_rows(seq, drafts):
    """The rows of a speculative step: the newest token, then each draft token, one decode row each."""
    return [Row(seq, seq.num_computed, 1, verify=True)] + [
        Row(seq, len(seq) + i, 1, token=t, verify=True) for i, t in enumerate(drafts)]


class StepDrafts:
    """The drafts a step's rows carry ({seq_id: tokens}) and its speculative rows, to verify after sampling."""

    def __init__(self, rows):
        self.tokens, self.verifying = {}, {}
        for row in rows:
            if row.verify:
                self.verifying.setdefault(row.seq.seq_id, [row.seq, len(row.seq), []])[2].append(row)
            if row.token is not None:
                self.tokens.setdefault(row.seq.seq_id, []).append(row.token)

    def of(self, seq):
        return self.tokens.get(seq.seq_id, [])

    def count(self):
        return sum(map(len, self.tokens.values()))

    def mark_wasted(self):
        """Row i of a speculative step gave its i-th token, if the step got that far; the rest are wasted."""
        for seq, before, rows in self.verifying.values():
            for row in rows[len(seq) - before:]:
                row.wasted = True

