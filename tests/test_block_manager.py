"""The block manager without a model: allocation and reference counts, hashed full blocks and prefix
hits, LRU reuse of freed blocks (unhashed first, then cached ones in the order they were freed, their
hash evicted when reused), and undoing the hashes of blocks a failed step never computed."""
from byzantium.engine.kv_cache import BlockManager

BS = 4


class Seq:  # what the block manager reads and writes of a sequence
    def __init__(self, token_ids):
        self.token_ids, self.block_table, self.block_hashes, self.num_computed = list(token_ids), [], [], 0


def _computed(bm, tokens):
    """A sequence whose tokens all have slots and whose full blocks are registered."""
    seq = Seq(tokens)
    bm.allocate(seq, len(tokens))
    bm.register_full_blocks(seq, len(tokens))
    seq.num_computed = len(tokens)
    return seq


def test_allocate_and_release_count_references():
    bm = BlockManager(8, BS)
    seq = Seq(range(10))
    assert bm.blocks_needed(seq, 10) == 3
    bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 and bm.num_used == 3 and all(bm.ref_counts[b] == 1 for b in seq.block_table)
    assert bm.blocks_needed(seq, 12) == 0 and bm.blocks_needed(seq, 13) == 1
    bm.release(seq)
    assert bm.num_used == 0 and seq.block_table == [] and bm.ref_counts == [0] * 8


def test_full_blocks_are_hit_by_an_identical_prefix_never_the_last_tokens_block():
    bm = BlockManager(16, BS)
    a = _computed(bm, range(10))  # blocks [0..3], [4..7] full; [8, 9] not
    ids, hashes = bm.match_prefix(list(range(10)) + [99])
    assert ids == a.block_table[:2] and hashes == a.block_hashes
    assert bm.match_prefix(list(range(8)))[0] == a.block_table[:1]  # 8 tokens: the 2nd block holds the last
    b = Seq(list(range(8)) + [50, 51])
    bm.acquire_prefix(b, ids, hashes)
    assert b.num_computed == 8 and [bm.ref_counts[x] for x in ids] == [2, 2]
    bm.release(a)
    assert [bm.ref_counts[x] for x in ids] == [1, 1] and bm.num_used == 2  # b still holds them


def test_a_hit_needs_the_whole_prefix():
    bm = BlockManager(16, BS)
    _computed(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(bm.match_prefix([1, 2, 3, 4, 5, 6, 7, 0, 9])[0]) == 1  # second block differs
    assert bm.match_prefix([0, 2, 3, 4, 5, 6, 7, 8, 9])[0] == []  # same second block after another first: no hit


def test_freed_blocks_keep_their_cache_and_unhashed_ones_are_reused_first():
    bm = BlockManager(4, BS)
    a = _computed(bm, range(6))  # block a0 hashed (full), a1 not
    hashed, unhashed = a.block_table
    bm.release(a)
    assert bm.match_prefix(list(range(6)))[0] == [hashed]  # still cached after release
    c = Seq([7] * 3)
    bm.allocate(c, 3)
    assert c.block_table == [unhashed]  # nothing cached in it: reused first
    d = Seq([8] * 12)
    bm.allocate(d, 12)  # the two never used, then the cached block, whose hash goes
    assert d.block_table[-1] == hashed and bm.match_prefix(list(range(6)))[0] == []


def test_a_failed_step_unregisters_what_it_never_computed():
    bm = BlockManager(8, BS)
    seq = Seq(range(12))
    bm.allocate(seq, 12)
    bm.register_full_blocks(seq, 12)  # scheduled: three blocks hashed
    seq.num_computed = 4  # but only the first block was computed before the step failed
    dropped = bm.unregister_uncomputed(seq)
    assert dropped == set(seq.block_table[1:]) and len(seq.block_hashes) == 1
    assert bm.match_prefix(list(range(12)) + [0])[0] == seq.block_table[:1]
