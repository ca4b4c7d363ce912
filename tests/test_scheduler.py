"""The scheduler without a model: admission in arrival order within max_num_seqs and the token budget,
chunked prefill across steps, decodes before new prompts, preemption of the newest unpinned sequence
when blocks run out (never a session), riders on identical requests, and draft rows within max_rows.

A step is simulated as the engine's postprocess leaves it: every row computed, and a row that ends
its sequence's prompt or decode gets one new token."""
import pytest

from byzantium.engine.config import EngineConfig
from byzantium.engine.kv_cache import BlockManager
from byzantium.engine.sampling import SamplingParams
from byzantium.engine.scheduler import Scheduler
from byzantium.engine.sequence import Sequence, Status
from byzantium.engine.speculation import PromptLookup

BS = 4


def request(seq_id, tokens, max_tokens=8, pinned=False):
    seq = Sequence(seq_id, list(tokens), None, pinned=pinned)
    seq.start_turn(SamplingParams(max_tokens=max_tokens), None)
    return seq


def compute(scheduler, rows, new_token=7):
    """What a step does to the rows' sequences: their tokens computed, a token sampled where a row ends one."""
    for row in rows:
        row.seq.num_computed = row.end
    for row in rows:
        if row.ends_sequence and not row.verify:
            row.seq.token_ids.append(new_token)
            for rider in scheduler.riding.get(row.seq.seq_id, ()):
                rider.num_computed = len(rider)
                rider.token_ids.append(new_token)


def shape(rows):
    return [(row.seq.seq_id, row.start, row.num_tokens) for row in rows]


def test_prompts_are_admitted_in_arrival_order_within_the_token_budget_and_chunked():
    scheduler = Scheduler(BlockManager(64, BS), EngineConfig(max_num_seqs=8, max_batch_tokens=10))
    a, b, c = request(0, range(6)), request(1, range(100, 107)), request(2, range(200, 203))
    for seq in (a, b, c):
        scheduler.add(seq)
    rows = scheduler.schedule()
    assert shape(rows) == [(0, 0, 6), (1, 0, 4)]  # b's prompt is cut at the budget; c waits behind it
    assert [s.seq_id for s in scheduler.running] == [0, 1] and list(scheduler.waiting) == [c]
    compute(scheduler, rows)
    rows = scheduler.schedule()
    # running first: a decodes, b's next chunk; then c is admitted with what is left of the budget
    assert shape(rows) == [(0, 6, 1), (1, 4, 3), (2, 0, 3)]
    assert [r.phase for r in rows] == ["decode", "prefill", "prefill"]


def test_max_num_seqs_bounds_the_running_set():
    scheduler = Scheduler(BlockManager(64, BS), EngineConfig(max_num_seqs=2, max_batch_tokens=100))
    seqs = [request(i, range(10 * i, 10 * i + 3)) for i in range(4)]
    for seq in seqs:
        scheduler.add(seq)
    assert {r.seq.seq_id for r in scheduler.schedule()} == {0, 1}
    assert [s.seq_id for s in scheduler.waiting] == [2, 3]
    scheduler.remove(seqs[0])  # finished: its place goes to the next in line
    assert seqs[0].status is Status.FINISHED
    assert 2 in {r.seq.seq_id for r in scheduler.schedule()}


def test_a_request_that_does_not_fit_waits_and_blocks_those_behind_it():
    scheduler = Scheduler(BlockManager(4, BS), EngineConfig(max_num_seqs=8, max_batch_tokens=100))
    big, small = request(0, range(20)), request(1, range(50, 52))
    scheduler.add(big)
    scheduler.add(small)
    with pytest.raises(RuntimeError, match="cannot hold the next request"):
        scheduler.schedule()  # 5 blocks needed, 4 in the pool, and nothing to preempt
    assert list(scheduler.waiting) == [big, small]  # first come, first served


def test_preemption_takes_the_newest_unpinned_sequence_and_requeues_it_first():
    blocks = BlockManager(6, BS)
    scheduler = Scheduler(blocks, EngineConfig(max_num_seqs=8, max_batch_tokens=100))
    session = request(0, range(7), pinned=True)
    old, new = request(1, range(100, 107)), request(2, range(200, 207))
    for seq in (session, old, new):
        scheduler.add(seq)
    rows = scheduler.schedule()  # 2 blocks each: the pool is full
    assert blocks.num_free == 0 and shape(rows) == [(0, 0, 7), (1, 0, 7), (2, 0, 7)]
    compute(scheduler, rows)
    rows = scheduler.schedule()  # the 8th tokens still fit in their second blocks
    assert shape(rows) == [(0, 7, 1), (1, 7, 1), (2, 7, 1)] and scheduler.num_preemptions == 0
    compute(scheduler, rows)
    rows = scheduler.schedule()  # each needs a third block for its 9th token: the newest unpinned goes
    assert scheduler.num_preemptions == 1
    assert new.status is Status.WAITING and scheduler.waiting[0] is new and new.block_table == []
    assert shape(rows) == [(0, 8, 1), (1, 8, 1)]  # the session and the older request go on
    assert new.num_computed == 0  # recomputed from its prompt (and prefix-cache hits) when it comes back


def test_identical_decoding_requests_ride_on_one_row():
    blocks = BlockManager(32, BS)
    scheduler = Scheduler(blocks, EngineConfig(max_num_seqs=8, max_batch_tokens=100))
    a, b = request(0, range(6)), request(1, range(6))
    scheduler.add(a)
    scheduler.add(b)
    rows = scheduler.schedule()
    assert shape(rows) == [(0, 0, 6)] and scheduler.riding == {0: [b]}  # b's prompt rides on a's row
    assert b.block_table == a.block_table
    compute(scheduler, rows)
    rows = scheduler.schedule()
    assert shape(rows) == [(0, 6, 1)] and scheduler.riding[0] == [b]  # and so does its decode


def test_drafts_are_fed_as_verify_rows_within_max_rows():
    scheduler = Scheduler(BlockManager(32, BS), EngineConfig(max_num_seqs=8, max_batch_tokens=100, max_model_len=64),
                          drafter=PromptLookup(num_tokens=3, max_rows=3))
    seq = request(0, [1, 2, 3, 9, 9, 1, 2], max_tokens=20)
    scheduler.add(seq)
    compute(scheduler, scheduler.schedule(), new_token=3)  # ... 1 2 3: the 3-gram seen at the start
    rows = scheduler.schedule()
    assert shape(rows) == [(0, 7, 1), (0, 8, 1), (0, 9, 1)]  # newest token, then 2 drafts: 3 rows in all
    assert [r.token for r in rows] == [None, 9, 9] and all(r.verify for r in rows)
