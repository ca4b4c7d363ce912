"""Continuous batching: which sequences run in the next forward pass, and with how many tokens.

Each step packs decodes (one token each) and prefill chunks of many sequences, bounded by
max_num_seqs and a token budget (max_batch_tokens); a long prompt is prefilled in chunks across
steps. When the block pool runs out, the most recently admitted unpinned sequence is preempted: its
blocks are released and it is recomputed later (its finished blocks often come back from the prefix
cache). Sessions are pinned: they keep their blocks and are never preempted.
"""
from collections import deque

from .sequence import Status


class Scheduler:
    def __init__(self, block_manager, max_num_seqs, max_batch_tokens):
        self.blocks = block_manager
        self.max_num_seqs, self.max_batch_tokens = max_num_seqs, max_batch_tokens
        self.waiting = deque()
        self.running = []
        self.num_preemptions = 0
        self.admitted_cached_tokens = 0  # prefix-cache hits of requests admitted since the last pop

    def pop_admitted_cached_tokens(self):
        n, self.admitted_cached_tokens = self.admitted_cached_tokens, 0
        return n

    def add(self, seq):
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_work(self):
        return bool(self.waiting or self.running)

    def schedule(self):
        """Return [(seq, num_new_tokens)] for the next step: decodes first, then prefill chunks."""
        budget = self.max_batch_tokens
        batch = []
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_uncomputed, budget)
            if n == 0:
                continue
            if not self._make_room(seq, seq.num_computed + n, batch):
                continue
            self._take(seq, n, batch)
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits, hashes = ([], []) if seq.block_table else self.blocks.match_prefix(seq.token_ids)
            computed = len(hits) * self.blocks.block_size if hits else seq.num_computed
            n = min(len(seq) - computed, budget)
            needed = -(-(computed + n) // self.blocks.block_size) - max(len(hits), len(seq.block_table))
            if needed > self.blocks.num_free_after_hits(hits):
                break  # first come, first served: later requests wait behind this one
            self.waiting.popleft()
            if hits:
                self.blocks.acquire_prefix(seq, hits, hashes)
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = len(hits) * self.blocks.block_size
            self.admitted_cached_tokens += len(hits) * self.blocks.block_size
            seq.status = Status.RUNNING
            self.running.append(seq)
            self._take(seq, n, batch)
            budget -= n
        if not batch and self.has_work():
            raise RuntimeError(
                "the KV cache cannot hold the next request: every block is held by open sessions or "
                "running requests that cannot be preempted; raise num_blocks or close sessions")
        # Decode rows (one token) first: the runner gives them the decode kernel as one group.
        batch.sort(key=lambda item: item[1] > 1)
        return batch

    def _take(self, seq, n, batch):
        self.blocks.allocate(seq, seq.num_computed + n)
        self.blocks.register_full_blocks(seq, seq.num_computed + n)
        batch.append((seq, n))

    def _make_room(self, seq, num_tokens, batch):
        """Free blocks for seq by preempting the newest unpinned running sequences not in this batch."""
        scheduled = {id(s) for s, _ in batch}
        while self.blocks.blocks_needed(seq, num_tokens) > self.blocks.num_free:
            victims = [s for s in self.running if not s.pinned and id(s) not in scheduled]
            victim = victims[-1] if victims else None
            if victim is None:
                return False
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq):
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq):
        """Called when a request ends: plain requests release their blocks, sessions keep them."""
        self.running.remove(seq)
        if seq.pinned:
            seq.status = Status.IDLE
        else:
            self.blocks.release(seq)
            seq.status = Status.FINISHED
