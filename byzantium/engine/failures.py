"""Failure isolation: a forward pass that raises fails only the requests whose rows raise on their own.

The pass is retried on halves of its rows until those rows are found (rows are independent: a rerun
rewrites the same K/V). Out of memory also lowers the token budget of later steps, and a single long
chunk is retried in two. What the failed rows were to compute never happened: the blocks they were to
fill are unhashed, and a row that took such a block as a prefix hit in this step is recomputed later.
All of it is asked of the scheduler (its methods); nothing here edits its queues or its block manager.
"""
import logging

import torch

from .sequence import Row

logger = logging.getLogger("byzantium")


class EngineFailed(RuntimeError):
    """The engine cannot go on (a tensor-parallel rank died): every request fails with it, none is retried."""


def out_of_memory(error):
    """An allocation failure: CUDA's OutOfMemoryError, Python's MemoryError, or torch's CPU allocator
    failing (a RuntimeError "DefaultCPUAllocator: can't allocate memory: you tried to allocate ...").
    Only these make a step retry smaller; other errors are not about its size."""
    return (isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError))
            or isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def forward_isolating(run, rows, on_out_of_memory):
    """run(rows) -> (seqs, logits or None), retried smaller when it raises. Returns (seqs, [logits]
    tensors, {seq_id: (seq, error)} of the rows that failed on their own)."""
    try:
        seqs, logits = run(rows)
        return seqs, [] if logits is None else [logits], {}
    except EngineFailed:
        raise
    except Exception as error:  # noqa: BLE001 - isolated below, given to the failing requests
        oom = out_of_memory(error)
        if oom:
            on_out_of_memory(sum(r.num_tokens for r in rows), error)
        if len(rows) > 1:
            half = len(rows) // 2
            parts = [rows[:half], rows[half:]]
        elif oom and rows[0].num_tokens > 1:  # one long chunk: its first half, then the rest
            row, half = rows[0], rows[0].num_tokens // 2
            parts = [[Row(row.seq, row.start, half)], [Row(row.seq, row.start + half, row.num_tokens - half)]]
        else:
            return [], [], {rows[0].seq.seq_id: (rows[0].seq, error)}
    seqs, logits, failed = [], [], {}
    for part in parts:
        if any(r.seq.seq_id in failed for r in part):  # the second half of a chunk whose first half failed
            continue
        part_seqs, part_logits, part_failed = forward_isolating(run, part, on_out_of_memory)
        seqs += part_seqs
        logits += part_logits
        failed.update(part_failed)
    return seqs, logits, failed


def shrink_budget(scheduler, device, num_tokens, error):
    """After running out of memory on num_tokens: the scheduler's later steps take at most half of them."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    budget = scheduler.shrink_budget(num_tokens)
    logger.warning("byzantium: out of memory in a forward pass of %d tokens (%s); retrying it in smaller "
                   "parts; steps now take at most %d tokens", num_tokens, str(error)[:200], budget)


def isolate(scheduler, rows, seqs, logits, failed):
    """After rows failed: fail their requests, undo what they scheduled; keep the rest of the step.
    Returns (kept rows, their seqs, their logits, the requests that ended)."""
    errors = {type(e).__name__ + ": " + str(e)[:200] for _, e in failed.values()}
    logger.error("byzantium: a forward pass failed for %d of %d requests (%s); they get the error, the "
                 "others go on", len(failed), len(rows), "; ".join(sorted(errors)))
    failed_rows = [r for r in rows if r.seq.seq_id in failed]
    kept, bad = discard(scheduler, rows, failed_rows)
    for seq, _ in failed.values():
        if seq.pinned and bad.intersection(seq.block_table):  # its prefix hit was never computed
            scheduler.drop_blocks(seq)
    ended = fail(scheduler, failed.values())
    kept_ids = {r.seq.seq_id for r in kept}
    keep = [i for i, seq in enumerate(seqs) if seq.seq_id in kept_ids]
    if len(keep) < len(seqs):
        seqs = [seqs[i] for i in keep]
        logits = logits[torch.tensor(keep, device=logits.device)] if keep else None
    return kept, seqs, logits, ended


def discard(scheduler, rows, lost):
    """The compute of `lost` rows (all rows when `lost` is empty: an interrupted step) did not happen:
    unhash the blocks they were to fill. A row that took such a block as a prefix hit in this step
    read K/V never written: its sequence is preempted (recomputed later). Returns (kept rows, the
    unhashed blocks)."""
    lost_ids = {r.seq.seq_id for r in (lost or rows)}
    bad = set()
    for row in lost or rows:
        bad |= scheduler.forget_uncomputed(row.seq)
    kept = [r for r in rows if r.seq.seq_id not in lost_ids]
    if not lost:  # interrupted: every row is recomputed
        for row in rows:
            scheduler.preempt(row.seq)
        return [], bad
    while True:
        readers = [r for r in kept if bad.intersection(r.seq.block_table)]
        if not readers:
            return kept, bad
        for row in readers:
            kept.remove(row)
            bad |= scheduler.forget_uncomputed(row.seq)
            scheduler.preempt(row.seq)


def fail(scheduler, seq_errors):
    """End these requests with their errors (finish_reason "error"). Returns them."""
    ended = []
    for seq, error in seq_errors:
        seq.error, seq.finish_reason = error, "error"
        scheduler.remove(seq)
        ended.append(seq)
    return ended
