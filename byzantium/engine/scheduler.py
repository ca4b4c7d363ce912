"""Continuous batching: which sequences run in the next forward pass, and with how many tokens.

Each step packs decodes (one token each) and prefill chunks of many sequences, bounded by
max_num_seqs and a token budget (max_batch_tokens); a long prompt is prefilled in chunks across
steps. When the block pool runs out, the most recently admitted unpinned sequence is preempted: its
blocks are released and it is recomputed later (its finished blocks often come back from the prefix
cache). Sessions are pinned: they keep their blocks and are never preempted.
"""
from collections import deque

from .sequence import Row, Status


class Scheduler:
    def __init__(self, block_manager, max_num_seqs, max_batch_tokens):
        self.blocks = block_manager
        self.max_num_seqs, self.max_batch_tokens = max_num_seqs, max_batch_tokens
        self.waiting = deque()
        self.running = []
        self.num_preemptions = 0
        self.admitted = [0, 0]  # since the last pop: prompt tokens found in the prefix cache, requests with a hit

    def pop_admitted(self):
        """(cached tokens, requests with a cache hit) of the requests admitted since the last call."""
        admitted, self.admitted = self.admitted, [0, 0]
        return tuple(admitted)

    def add(self, seq):
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def remove(self, seq):
        """Take a request out, whatever it is doing (finished, aborted, failed): plain requests release
        their blocks, sessions keep them and become idle."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        if seq.pinned:
            seq.status = Status.IDLE
        else:
            self.blocks.release(seq)
            seq.status = Status.FINISHED

    def has_work(self):
        return bool(self.waiting or self.running)

    def schedule(self):
        """Return the next step's rows: running sequences first, then newly admitted prefill chunks."""
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
            self.admitted[0] += len(hits) * self.blocks.block_size
            self.admitted[1] += bool(hits)
            seq.status = Status.RUNNING
            self.running.append(seq)
            self._take(seq, n, batch)
            budget -= n
        if not batch and self.has_work():
            raise RuntimeError(
                "the KV cache cannot hold the next request: every block is held by open sessions or "
                "running requests that cannot be preempted; raise num_blocks or close sessions")
        return batch

    def _take(self, seq, n, batch):
        self.blocks.allocate(seq, seq.num_computed + n)
        self.blocks.register_full_blocks(seq, seq.num_computed + n)
        batch.append(Row(seq, seq.num_computed, n))

    def _make_room(self, seq, num_tokens, batch):
        """Free blocks for seq by preempting the newest unpinned running sequences not in this batch."""
        scheduled = {id(row.seq) for row in batch}
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

