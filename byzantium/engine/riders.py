"""Riders after a forward pass: requests that another request's rows computed.

The scheduler lets a request ride on a leader whose tokens are the same (scheduler.riding): it holds the
leader's blocks and takes the leader's logits. A scoring rider is given those logits; a sampling rider
draws its own token from them with its own noise, so its tokens are what its own rows would have given.
Here, after the pass: what they are given, what they count in the stats, and a rider that sampled a
token other than its leader's parting from it (its own copy of the shared last block, or, with no free
block, a preemption: it is recomputed later).
"""


def give_logits(leader, riders, row, totals):
    """Scoring riders end with their leader's logits. Returns them."""
    for rider in riders:
        rider.logits, rider.finish_reason = leader.logits, "logits"
        totals["shared_prefill_tokens"] += row.num_tokens
    return list(riders)


def part_ways(riders, ended, scheduler, copy_block, totals):
    """After sampling, for each (rider, leader, rider's length before, leader's row): count what the
    rider got without a row of its own, and part it from a leader whose tokens it no longer shares.
    Returns the stats rows of the decode tokens riders got: (tag, "decode", tokens, seq_id)."""
    rows = []
    for rider, leader, before, row in riders:
        if row.phase == "prefill":  # a prompt it did not compute; its first token is not a decode token
            totals["shared_prefill_tokens"] += row.num_tokens
        elif len(rider) > before:
            rows.append((rider.tag, "decode", len(rider) - before, rider.seq_id))
            totals["shared_decode_tokens"] += len(rider) - before
        if id(rider) not in ended and rider.token_ids != leader.token_ids:
            scheduler.part(rider, copy_block)
    return rows
