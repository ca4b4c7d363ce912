"""The CUDA sampler (sampler.py's contract): every row of a step sampled together on the device, one host sync.

It runs on CPU tensors as well (the tests compare it with cpu.py there). cpu.py goes row by row (a
compiled race and a host sync per sampled row); this one computes all rows at once and reads tokens,
flags and logprobs back with a single .tolist().

The same random stream as cpu.py: the i-th token a request samples is the argmax of its row's
kept logits (over the temperature) plus Gumbel noise hashed from (the request's key, i) and each token
id (noise.stream, noise.gumbel_noise; the key is its seed, else the random initial seed of its own
generator). The two words of the stream are hashed on the host (N a step, microseconds) and travel with
the other per-row parameters in one small copy. Everything before the race (penalties, temperature,
top-k, top-p) is a function of the row alone, so the token is the same whichever rows share the batch,
and rounding noise in the logits moves it only when the two best scores are that close. Greedy rows
are argmax.

Differences from cpu.py: top-k keeps exactly k tokens (ties at the k-th logit: the lower ids),
where the CPU sampler keeps every token tied with the k-th; and the noise's logs round as torch's do,
where the compiled CPU race uses its own polynomial (a token differs only at a near-tie of ~1e-7).
Plain rows race over the whole vocabulary, NOISE_ROWS rows at a time ([64, vocab] int64 hashes).

Top-k / top-p rows look at the best CANDIDATES tokens first (torch.topk: a full sort of 150k-token
rows costs milliseconds); a top-p row whose nucleus reaches past them (a flat distribution) is redone
over the whole sorted vocabulary after the read-back: a second sync, only in that case. (Which of the
tokens tied exactly at the CANDIDATES-th logit torch.topk returns is its own choice; it matters only when
the kept tokens end exactly there.)
"""
import torch

from ..grammar import apply_bitmask
from .noise import gumbel_noise, request_key, stream
from .sampler import check_constraints

CANDIDATES = 1024
NOISE_ROWS = 64


def _send(values, dtype, device):
    """A small host list on the device: pinned and non-blocking on CUDA (no stream sync)."""
    cuda = device.type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=cuda).to(device, non_blocking=cuda)


def _penalize(logits, requests):
    """OpenAI's presence and frequency penalties (cpu._penalize's arithmetic) for the rows that
    have them, all at once: counts by scatter_add (torch.bincount would sync on CUDA)."""
    rows = [i for i, r in enumerate(requests)
            if (r.params.presence_penalty or r.params.frequency_penalty) and r.output_ids]
    if not rows:
        return logits
    vocab, device = logits.shape[1], logits.device
    flat = [j * vocab + t for j, i in enumerate(rows) for t in requests[i].output_ids if 0 <= t < vocab]
    counts = torch.zeros(len(rows) * vocab, dtype=logits.dtype, device=device)
    counts.scatter_add_(0, _send(flat, torch.int64, device), torch.ones(len(flat), dtype=logits.dtype, device=device))
    counts = counts.view(len(rows), vocab)
    per_row = _send([[requests[i].params.frequency_penalty, requests[i].params.presence_penalty] for i in rows],
                    logits.dtype, device)
    index = _send(rows, torch.int64, device)
    penalized = logits.index_select(0, index) - per_row[:, :1] * counts - per_row[:, 1:] * (counts > 0).to(logits.dtype)
    return logits.clone().index_copy_(0, index, penalized)


def _race(scores, ids, lo, hi):
    """Per row, the index of the best of scores + Gumbel noise of token ids `ids` ([V] for every row, or
    [R, V]; excluded tokens: -inf); and whether the row had a finite winner (not all excluded, no NaN or inf
    logits). NOISE_ROWS rows at a time, so the int64 hashes stay small ([64, vocab])."""
    indices, finite = [], []
    for start in range(0, scores.shape[0], NOISE_ROWS):
        rows = slice(start, start + NOISE_ROWS)
        best = (scores[rows] + gumbel_noise(lo[rows], hi[rows], ids if ids.dim() == 1 else ids[rows])).max(dim=-1)
        indices.append(best.indices)
        finite.append(torch.isfinite(best.values))
    return torch.cat(indices), torch.cat(finite)


def _plain(x, lo, hi):
    """Temperature-only rows (x already divided by it): the whole vocabulary."""
    return _race(x, torch.arange(x.shape[1], device=x.device), lo, hi)


def _narrow(x, top_k, top_p, lo, hi, width):
    """Top-k / top-p rows over their first `width` tokens in the order (logit desc, id asc).

    top_k: [R] long, the vocabulary size where unset; top_p: [R] fp64, inf where unset. Returns
    (tokens, ok, complete): complete is False for rows whose kept tokens may reach past `width`."""
    vocab = x.shape[1]
    if width >= vocab:
        vals, ids = torch.sort(x, dim=-1, descending=True, stable=True)
    else:
        vals, ids = torch.topk(x, width, dim=-1)
        ids, order = ids.sort(dim=-1)  # ties in any order from topk -> lower id first, as the full sort
        vals = vals.gather(1, order)
        vals, order = vals.sort(dim=-1, descending=True, stable=True)
        ids = ids.gather(1, order)
    in_k = torch.arange(vals.shape[1], device=x.device)[None, :] < top_k[:, None]
    # Probabilities renormalised over the k kept tokens (the softmax of the top-k-masked row, as
    # cpu.sample), or over the whole row when top-k is off. Softmax and cumsum, not logsumexp: they
    # reduce each row alone, where a reduction's split (so its rounding) may depend on the batch shape.
    probs = torch.where((top_k < vocab)[:, None], torch.softmax(vals.masked_fill(~in_k, float("-inf")), dim=-1),
                        torch.softmax(x, dim=-1).gather(1, ids)).double()
    before = probs.cumsum(dim=-1) - probs  # mass before each token: it stays while that is < top_p
    keep = in_k & (before < top_p[:, None])
    complete = (top_k <= width) | (before[:, -1] + probs[:, -1] >= top_p)
    choice, ok = _race(vals.masked_fill(~keep, float("-inf")), ids, lo, hi)
    return ids.gather(1, choice[:, None])[:, 0], ok, complete


def _sample_rows(work, rows, params, keys, counters, vocab, width):
    """Tokens for the sampled rows `rows` (plain when `width` is None, else narrow over `width`
    candidates). Returns device tensors (row index, tokens, ok, complete)."""
    device = work.device
    table, streams = [], []
    for i in rows:
        p = params[i]
        k = p.top_k if 0 < p.top_k < vocab else vocab
        table.append([i, p.temperature, k, p.top_p if p.top_p < 1 else float("inf")])
        streams.append([i, *stream(keys[i], counters[i])])
    table = _send(table, torch.float64, device)
    streams = _send(streams, torch.int64, device)  # the words need all their bits: not through fp64
    index = streams[:, 0]
    lo, hi = streams[:, 1:2], streams[:, 2:3]
    x = work.index_select(0, index) / table[:, 1:2].to(work.dtype)
    if width is None:
        tokens, ok = _plain(x, lo, hi)
        return index, tokens, ok, torch.ones_like(ok)
    return index, *_narrow(x, table[:, 2].long(), table[:, 3], lo, hi, width)


def sample(logits, requests, allowed=None):
    """One token per row of `logits` [N, V] (fp32) for `requests`: sampler.py's contract (the grammar
    masks applied on the device in one masked fill)."""
    n, vocab = logits.shape
    device = logits.device
    params = [r.params for r in requests]
    check_constraints(requests, allowed)
    work = _penalize(logits if allowed is None else apply_bitmask(logits, allowed), requests)
    tokens = work.argmax(dim=-1)  # greedy rows are done; sampled rows are overwritten below
    keys = [None if p.greedy else request_key(r) for p, r in zip(params, requests)]
    counters = [len(r.output_ids) for r in requests]
    sampled = [i for i in range(n) if not params[i].greedy]
    top_k = {i: params[i].top_k if 0 < params[i].top_k < vocab else 0 for i in sampled}  # 0: off
    plain = [i for i in sampled if not top_k[i] and params[i].top_p >= 1]
    narrow = [i for i in sampled if top_k[i] or params[i].top_p < 1]
    first = min(vocab, CANDIDATES)
    groups = [(plain, None), ([i for i in narrow if top_k[i] <= first], first),
              ([i for i in narrow if top_k[i] > first], vocab)]
    flags, order = [], []  # per group: ok, complete (one flag per row each)
    for rows, width in groups:
        if rows:
            index, picked, ok, complete = _sample_rows(work, rows, params, keys, counters, vocab, width)
            tokens.index_copy_(0, index, picked)
            flags += [ok, complete]
            order.append(rows)

    wanted = [i for i in range(n) if params[i].logprobs is not None]
    top_n = max([params[i].logprobs for i in wanted], default=0)
    parts = [tokens.double(), *(f.double() for f in flags)]
    if wanted:
        wanted_index = _send(wanted, torch.int64, device)
        all_logprobs = torch.log_softmax(logits.index_select(0, wanted_index), dim=-1)
        parts.append(all_logprobs.gather(1, tokens.index_select(0, wanted_index)[:, None])[:, 0].double())
        if top_n:
            top = torch.topk(all_logprobs, top_n, dim=-1)
            parts += [top.values.double().flatten(), top.indices.double().flatten()]
    values = torch.cat(parts).tolist()  # the one host sync

    out_tokens = [int(t) for t in values[:n]]
    at = n
    redo = []
    for rows in order:
        ok, complete = values[at:at + len(rows)], values[at + len(rows):at + 2 * len(rows)]
        at += 2 * len(rows)
        if not all(ok):
            bad = [i for i, good in zip(rows, ok) if not good]
            raise RuntimeError(f"sampling: rows {bad[:5]} have no valid probability distribution (NaN or inf logits)")
        redo += [i for i, done in zip(rows, complete) if not done]
    chosen = values[at:at + len(wanted)]
    at += len(wanted)
    top_values = values[at:at + len(wanted) * top_n]
    top_ids = values[at + len(wanted) * top_n:at + 2 * len(wanted) * top_n]

    if redo:  # rare: a top-p nucleus wider than CANDIDATES tokens; the whole sorted vocabulary
        _, picked, ok, _ = _sample_rows(work, redo, params, keys, counters, vocab, vocab)
        redo_values = torch.cat([picked.double(), ok.double()]).tolist()
        if not all(redo_values[len(redo):]):
            raise RuntimeError("sampling: a row has no valid probability distribution (NaN or inf logits)")
        for i, token in zip(redo, redo_values[:len(redo)]):
            out_tokens[i] = int(token)
        if wanted:
            position = {i: j for j, i in enumerate(wanted)}
            again = [i for i in redo if i in position]
            if again:
                rows = torch.tensor([position[i] for i in again], device=device)
                ids = torch.tensor([out_tokens[i] for i in again], device=device)
                for i, lp in zip(again, all_logprobs[rows, ids].tolist()):
                    chosen[position[i]] = lp

    logprobs = [None] * n
    for j, i in enumerate(wanted):
        entry = {out_tokens[i]: chosen[j]}
        k = params[i].logprobs
        if k:
            row = slice(j * top_n, j * top_n + k)
            entry.update(zip((int(t) for t in top_ids[row]), top_values[row]))
        logprobs[i] = entry
    return out_tokens, logprobs
