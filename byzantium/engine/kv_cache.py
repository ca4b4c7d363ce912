"""Paged KV cache: the preallocated block pool and the BlockManager with prefix caching.

Only full blocks are hashed: hash(parent block's hash + this block's token ids), so a hash names the
whole prefix up to the block's end. A hit is confirmed by comparing the token ids. A freed block keeps
its hash (and so its cached K/V) until it is handed out again; the free list is LRU: unhashed blocks
are reused first, then hashed blocks in the order they were freed.
"""
import hashlib
import math
import mmap
from array import array
from collections import OrderedDict

import torch

from ..kernels.reference import FP8_KV


def block_hash(parent, token_ids):
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()


def allocate_kv_cache(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device, reserve=False):
    """One zero-filled tensor [layers, 2, blocks, block_size, kv_heads, head_dim]; layer i uses cache[i, 0] /
    cache[i, 1].

    On CPU the memory is an anonymous mapping: the kernel hands out zero pages on first write, so a pool
    costs resident memory only for the blocks used (torch.zeros would write, and so touch, every page).
    Private, not shared: a first write to a private page costs less system time than one to a shared
    (shmem) page; huge pages are not asked for, as zeroing and compacting them costs more than they save
    (timings: bench/results/cpu_kernels.md).
    reserve: every page written now, so the pool is resident from the start (a budget the user set:
    resident memory does not then climb as blocks are first used, which reads as a leak).
    """
    shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    private = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_ANONYMOUS") else {}  # Windows: none
    pages = mmap.mmap(-1, nbytes, **private)
    if reserve:
        torch.frombuffer(pages, dtype=torch.uint8).fill_(0)
    return torch.frombuffer(pages, dtype=dtype).view(shape)  # the tensor keeps the mapping


def kv_cache_dtype(kv_cache_dtype, dtype):
    """The pool's dtype for EngineConfig.kv_cache_dtype: "fp8" e4m3 (K/V at scale 1: kernels.reference.
    cast_for_cache), "auto" the model's `dtype`."""
    return FP8_KV if kv_cache_dtype == "fp8" else dtype


class BlockManager:
    def __init__(self, num_blocks, block_size):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_counts = [0] * num_blocks
        self.hashes = [None] * num_blocks  # block id -> hash it is registered under
        self.tokens = [None] * num_blocks  # block id -> token ids, to confirm hits
        self.hash_to_block = {}
        self.free = OrderedDict((i, None) for i in range(num_blocks))  # front = reused first

    @property
    def num_free(self):
        return len(self.free)

    def blocks_needed(self, seq, num_tokens):
        """New blocks `seq` needs so that its first num_tokens tokens have slots."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    # -- prefix cache --------------------------------------------------------------------------------
    def match_prefix(self, token_ids):
        """Cached blocks (ids, hashes) holding a prefix of token_ids, never the block of the last token:
        a prompt that is entirely cached still computes its last token to get logits."""
        ids, hashes, parent = [], [], b""
        for i in range((len(token_ids) - 1) // self.block_size):
            chunk = token_ids[i * self.block_size:(i + 1) * self.block_size]
            h = block_hash(parent, chunk)
            block = self.hash_to_block.get(h)
            if block is None or self.tokens[block] != tuple(chunk):
                break
            ids.append(block)
            hashes.append(h)
            parent = h
        return ids, hashes

    def num_free_after_hits(self, hit_ids):
        return self.num_free - sum(1 for b in hit_ids if self.ref_counts[b] == 0)

    def acquire_prefix(self, seq, hit_ids, hit_hashes):
        for b in hit_ids:
            if self.ref_counts[b] == 0:
                del self.free[b]
            self.ref_counts[b] += 1
        seq.block_table = list(hit_ids)
        seq.block_hashes = list(hit_hashes)
        seq.num_computed = len(hit_ids) * self.block_size

    def register_full_blocks(self, seq, num_tokens):
        """Hash the blocks of `seq` that are full within its first num_tokens tokens.

        Called when the step that computes those tokens is scheduled: the forward pass stores every
        token's K/V before any attention reads it, so a sequence hitting these blocks in the same step
        reads the right values.
        """
        bs = self.block_size
        for i in range(len(seq.block_hashes), num_tokens // bs):
            chunk = seq.token_ids[i * bs:(i + 1) * bs]
            parent = seq.block_hashes[-1] if seq.block_hashes else b""
            h = block_hash(parent, chunk)
            seq.block_hashes.append(h)
            block = seq.block_table[i]
            if h not in self.hash_to_block:  # an identical block computed elsewhere stays the registered one
                self.hash_to_block[h] = block
                self.hashes[block] = h
                self.tokens[block] = tuple(chunk)

    def unregister_uncomputed(self, seq):
        """Undo register_full_blocks for the blocks of `seq` past its computed tokens (a step that
        failed): nobody may hit them. Returns the blocks unhashed here (other sequences that took them
        as a prefix hit in the same step read K/V that was never written)."""
        bs, dropped = self.block_size, set()
        for i in range(seq.num_computed // bs, len(seq.block_hashes)):
            block, h = seq.block_table[i], seq.block_hashes[i]
            if self.hash_to_block.get(h) == block:
                del self.hash_to_block[h]
                self.hashes[block] = self.tokens[block] = None
                dropped.add(block)
        del seq.block_hashes[seq.num_computed // bs:]
        return dropped

    @property
    def num_used(self):
        return self.num_blocks - len(self.free)

    # -- allocation ----------------------------------------------------------------------------------
    def allocate(self, seq, num_tokens):
        """Give `seq` slots for its first num_tokens tokens. The caller checked blocks_needed <= num_free."""
        for _ in range(self.blocks_needed(seq, num_tokens)):
            block, _ = self.free.popitem(last=False)
            if self.hashes[block] is not None:  # evict the cached content it held
                if self.hash_to_block.get(self.hashes[block]) == block:
                    del self.hash_to_block[self.hashes[block]]
                self.hashes[block] = self.tokens[block] = None
            self.ref_counts[block] = 1
            seq.block_table.append(block)

    def release(self, seq):
        """Drop the sequence's references; blocks nobody uses go back to the free list."""
        for block in reversed(seq.block_table):  # tail blocks first: they are the least likely to be shared
            self._drop(block)
        seq.block_table, seq.block_hashes = [], []
        seq.num_computed = 0

    def _drop(self, block):
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free[block] = None
            if self.hashes[block] is None:
                self.free.move_to_end(block, last=False)  # nothing cached in it: reuse it first

    # -- identical contexts (the scheduler's riders) --------------------------------------------------
    def share(self, seq, other):
        """seq, whose tokens are other's, holds other's blocks instead of its own (the same K/V)."""
        for block in other.block_table:
            self.ref_counts[block] += 1
        computed = seq.num_computed
        self.release(seq)
        seq.block_table, seq.block_hashes = list(other.block_table), list(other.block_hashes)
        seq.num_computed = computed

    def unshare(self, seq, copy_block):
        """seq parts from the sequences it shared blocks with: the block it writes next becomes its own
        (copy_block(src, dst) copies the K/V computed so far) and the blocks after it are dropped. Returns
        False, changing nothing, when no block is free for the copy."""
        bs, p = self.block_size, seq.num_computed
        keep = -(-p // bs)  # the blocks that hold positions before p
        copy = p % bs and self.ref_counts[seq.block_table[keep - 1]] > 1
        if copy and not self.free:
            return False
        for block in seq.block_table[keep:]:
            self._drop(block)
        del seq.block_table[keep:]
        del seq.block_hashes[p // bs:]
        if copy:
            src = seq.block_table[-1]
            seq.block_table.pop()
            self.allocate(seq, keep * bs)
            copy_block(src, seq.block_table[-1])
            self._drop(src)
        return True
