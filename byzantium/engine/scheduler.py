"""Continuous batching: which sequences run in the next forward pass, and with how many tokens.

Each step packs decodes (one token each) and prefill chunks of many sequences, bounded by
max_num_seqs and a token budget (max_batch_tokens); a long prompt is prefilled in chunks across
steps. When the block pool runs out, the most recently admitted unpinned sequence is preempted: its
blocks are released and it is recomputed later (its finished blocks often come back from the prefix
cache). Sessions are pinned: they keep their blocks and are never preempted. With a drafter
(speculation.py), a decoding request may also take its draft tokens, while the step's rows stay within
the drafter's max_rows and the drafts fit in free blocks.

Requests whose tokens are identical (the same prompt, the same tokens sampled so far: judges of one
answer, greedy copies of one call) are computed once: the first of them takes the row, the others ride on
it (`riding`): they hold its blocks and are sampled from its logits (or given them: scoring requests),
each with its own noise, so their tokens are what their own rows would have given. That holds for decoding
requests and for prompts admitted in the same step as an identical one whose row finishes its prompt. A
rider that samples another token parts at once (the engine's postprocess: BlockManager.unshare).
"""
from collections import deque

from . import prompt_logprobs
from .sequence import Row, Status
from .speculation import draft_tokens, speculative_rows


class Scheduler:
    def __init__(self, block_manager, config, drafter=None):
        """config: the engine's EngineConfig (its limits: max_num_seqs, max_batch_tokens, max_model_len)."""
        self.blocks, self.config, self.drafter = block_manager, config, drafter
        self.max_num_seqs, self.max_model_len = config.max_num_seqs, config.max_model_len
        self.max_batch_tokens = config.max_batch_tokens  # this scheduler's own: lowered after running out of memory
        self.riding = {}  # this step: leader seq_id -> the sequences riding on its rows
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

    def finish(self, seqs):
        """These requests ended (finished, or failed): out of the queues, their blocks released."""
        for seq in seqs:
            self.remove(seq)

    def take_all(self):
        """Every request queued, running or riding, each once, taken out (the engine cannot go on)."""
        riders = [seq for seqs in self.riding.values() for seq in seqs]
        every = list({id(seq): seq for seq in [*self.running, *self.waiting, *riders]}.values())
        self.running, self.waiting, self.riding = [], deque(), {}
        for seq in every:
            seq.status = Status.FINISHED  # remove() then leaves the lists alone and frees what it holds
            self.remove(seq)
        return every

    def has_work(self):
        return bool(self.waiting or self.running)

    def schedule(self):
        """Return the next step's rows: running sequences first, then newly admitted prefill chunks."""
        budget = self.max_batch_tokens
        keys = {id(seq): self._context(seq) for seq in self.running
                if seq.num_uncomputed == 1 and self._decoding(seq) and not seq.pinned}
        # Drafts fill the step up to max_rows, counting a row for each distinct context that decodes.
        draft_rows = self.drafter.max_rows - len(set(keys.values())) - (len(self.running) - len(keys)) \
            if self.drafter is not None else 0
        batch, leaders, self.riding = [], {}, {}
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_uncomputed, budget)
            if n == 0:
                continue
            key = keys.get(id(seq)) if n == 1 else None
            leader = leaders.get(key)
            if leader is not None and leader.token_ids == seq.token_ids:
                self.blocks.share(seq, leader)
                self.riding[leader.seq_id].append(seq)
                continue
            drafts = self._drafts(seq, min(draft_rows, budget - 1)) if draft_rows > 0 and n == 1 else []
            if not self._make_room(seq, seq.num_computed + n + len(drafts), batch):
                continue
            self._take(seq, n, batch, drafts)
            budget -= n + len(drafts)
            draft_rows -= len(drafts)
            if key is not None:
                leaders[key], self.riding[seq.seq_id] = seq, []
        prompts = {}  # (logits only, tokens) -> a request admitted in this step whose row ends its prompt
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            alone = seq.block_table or seq.pinned or seq.prompt_logprobs_from is not None
            twin = prompts.get((seq.logits_only, tuple(seq.token_ids))) if not alone else None
            if twin is not None:  # the same prompt: it rides on twin's row
                self.waiting.popleft()
                self.blocks.share(seq, twin)
                if seq.num_cached_tokens is None:
                    seq.num_cached_tokens = twin.num_cached_tokens
                seq.status = Status.RUNNING
                self.running.append(seq)
                self.riding[twin.seq_id].append(seq)
                continue
            if budget <= 0:
                break
            hits, hashes = ([], []) if seq.block_table else self.blocks.match_prefix(seq.token_ids)
            cap = prompt_logprobs.cache_cap(seq, self.blocks.block_size)  # positions it needs logits of
            if cap is not None:
                hits, hashes = hits[:cap], hashes[:cap]
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
            if seq.num_computed + n == len(seq) and not seq.pinned:
                prompts.setdefault((seq.logits_only, tuple(seq.token_ids)), seq)
                self.riding.setdefault(seq.seq_id, [])
        if not batch and self.has_work():
            raise RuntimeError(
                "the KV cache cannot hold the next request: every block is held by open sessions or "
                "running requests that cannot be preempted; raise num_blocks or close sessions")
        return batch

    @staticmethod
    def _decoding(seq):
        """Its next row feeds a sampled token (not a prompt's last token, a recompute, a scoring request)."""
        return not seq.logits_only and seq.params is not None and seq.num_computed >= seq.output_start

    def _context(self, seq):
        """A key naming seq's tokens: the chain hash of its hashed blocks and the tokens after them."""
        hashed = len(seq.block_hashes)
        return len(seq), seq.block_hashes[-1] if hashed else b"", tuple(seq.token_ids[hashed * self.blocks.block_size:])

    def _drafts(self, seq, k):
        if not self._decoding(seq):
            return []
        return draft_tokens(self.drafter, seq, k, self.max_model_len, self.blocks)

    def _take(self, seq, n, batch, drafts=()):
        self.blocks.allocate(seq, seq.num_computed + n + len(drafts))
        self.blocks.register_full_blocks(seq, seq.num_computed + n)  # draft tokens are not content yet
        batch.extend(speculative_rows(seq, drafts) if drafts else [Row(seq, seq.num_computed, n)])

    def _make_room(self, seq, num_tokens, batch):
        """Free blocks for seq by preempting the newest unpinned running sequences not in this batch."""
        scheduled = {id(row.seq) for row in batch} | {id(s) for riders in self.riding.values() for s in riders}
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
        """Release seq's blocks and put it first in the queue: it is recomputed later."""
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # -- what failure isolation (failures.py) and riders (riders.py) ask of it ---------------------------
    def shrink_budget(self, num_tokens):
        """After running out of memory on num_tokens: later steps take at most half of them. Returns the budget."""
        self.max_batch_tokens = max(1, min(self.max_batch_tokens, num_tokens // 2))
        return self.max_batch_tokens

    def forget_uncomputed(self, seq):
        """seq's rows of this step were not computed: its blocks they were to fill leave the prefix cache.
        Returns those blocks."""
        return self.blocks.unregister_uncomputed(seq)

    def drop_blocks(self, seq):
        """seq (a session that failed) lets go of its blocks: a prefix it took was never computed."""
        self.blocks.release(seq)

    def part(self, rider, copy_block):
        """A rider that sampled another token than its leader gets its own copy of the shared last block, or,
        with no free block, is preempted (recomputed later)."""
        if not self.blocks.unshare(rider, copy_block):
            self.preempt(rider)

