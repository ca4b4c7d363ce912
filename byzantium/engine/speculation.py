"""Prompt-lookup speculation: draft tokens copied from a request's own context, checked in one step.

A decoding request whose newest tokens (an n-gram, n from max_n down to min_n) occurred earlier in its
prompt or output proposes the tokens that followed that occurrence, at most `num_tokens` of them. The
step feeds them after its newest token as single-token rows (Row.token), each one a decode query over
the context before it, exactly as a step of plain decoding would compute it, and takes every row's
logits. The engine then samples row after row with the request's own noise for that position
(sampling.py: a request's i-th token races its logits against noise hashed from its key and i) and
keeps a draft token only while it is the token sampled there. So the tokens are the ones decoding one
at a time would have produced, at any temperature, and a step yields 1 to num_tokens + 1 of them.
Rejected drafts leave K/V past the sequence's computed length, which its next tokens overwrite; their
blocks are never hashed into the prefix cache.

It pays where a step costs what reading the weights costs (few rows a step: small batches on a CPU,
most decode steps on a GPU), and repetitive text (judges restating the problem, refinements copying an
answer, a small model's loops) is what it drafts well. A step's draft rows are capped (`max_rows`, all
rows of the step counted), so that a step whose rows already make it compute-bound does not grow.
"""


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
