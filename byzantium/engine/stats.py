"""Per-step records of the engine, their totals, a breakdown by request tag, and exports.

Each forward pass is one record: its rows (tag, phase, tokens) summed per (tag, phase), its sequences,
KV blocks in use, prefix-cache hits and wall time. Times are integer nanoseconds, so every split below
is exact: a step's prefill_ns + decode_ns == ns, and the records sum to the totals.

How a step's time is attributed to its prefill rows and its decode rows (each record names its rule):
- "pure": the step has rows of one phase only; that phase gets all of it.
- "measured": the engine ran the step's prefill rows and decode rows as two separately timed passes
  (profiling on: phase_seconds); the step's wall time is split in the ratio of the two passes' times
  (what lies outside both passes, scheduling and sampling, follows that ratio).
- "model": a fused mixed step is split in the ratio (a + b*P) : (a + c*D) (P prefill tokens, D decode
  rows) of the cost model seconds ~ a + b*P + c*D, fitted by least squares on the pure steps of this run
  recorded before it: what each phase would cost as a pass of its own, as "measured" times them.
- "token share": while the model cannot be fitted (fewer than MIN_PURE pure steps of either phase, no
  spread in their sizes, or b or c not positive), in the ratio P : D (a forward pass's FLOPs grow with
  its tokens).
The rates are tokens / attributed seconds of the same phase, over every step. Within a phase, a step's
time is shared among its rows by tokens; the by-tag breakdown sums those shares per (tag, phase).
"""
import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np

PHASES = ("prefill", "decode")
RULES = ("measured", "model", "token share")  # the rules that split a mixed step
MIN_PURE = 2  # pure steps of each phase the cost model needs


@dataclass
class StepRecord:
    step: int
    start_ns: int  # since the stats were reset
    ns: int  # wall time of the step
    prefill_ns: int  # the part attributed to prefill rows; prefill_ns + decode_ns == ns
    decode_ns: int
    attribution: str  # "pure", "measured", "model" or "token share"
    phase: str  # "prefill", "decode" or "mixed"
    num_seqs: int
    prefill_tokens: int
    decode_tokens: int
    kv_blocks_used: int  # after the step
    cached_tokens: int  # prompt tokens that requests admitted in this step found in the prefix cache
    cache_hits: int  # requests admitted in this step that found any
    tags: list  # [tag, phase, rows, tokens, ns] per (tag, phase) in the step
    requests: list = field(default_factory=list)  # the request id of each row, in row order

    start = property(lambda self: self.start_ns / 1e9)
    seconds = property(lambda self: self.ns / 1e9)
    prefill_seconds = property(lambda self: self.prefill_ns / 1e9)
    decode_seconds = property(lambda self: self.decode_ns / 1e9)

    def to_dict(self):
        return {**asdict(self), "start": self.start, "seconds": self.seconds,
                "prefill_seconds": self.prefill_seconds, "decode_seconds": self.decode_seconds}


def split(total, weights):
    """The integer `total` in parts proportional to `weights`, summing exactly to it (cumulative floors)."""
    whole, acc, done, parts = sum(weights), 0, 0, []
    for w in weights:
        acc += w
        cut = total * acc // whole if whole else 0
        parts.append(cut - done)
        done = cut
    return parts


class CostModel:
    """seconds ~ a + b*prefill_tokens + c*decode_rows by least squares over pure steps (running sums)."""

    def __init__(self):
        self.xtx, self.xty = np.zeros((3, 3)), np.zeros(3)
        self.count = dict.fromkeys(PHASES, 0)
        self.coef, self.fresh = None, True

    def add(self, phase, prefill_tokens, decode_rows, seconds):
        x = np.array([1.0, prefill_tokens, decode_rows])
        self.xtx += np.outer(x, x)
        self.xty += x * seconds
        self.count[phase] += 1
        self.fresh = False

    def costs(self, prefill_tokens, decode_rows):
        """(a + b*P, a + c*D): each phase's cost as a pass of its own; None while the model cannot be fitted."""
        if not self.fresh:
            self.fresh, self.coef = True, None
            if min(self.count.values()) >= MIN_PURE:
                coef, _, rank, _ = np.linalg.lstsq(self.xtx, self.xty, rcond=None)
                if rank == 3 and coef[1] > 0 and coef[2] > 0:
                    self.coef = coef
        if self.coef is None:
            return None
        a, b, c = max(self.coef[0], 0.0), self.coef[1], self.coef[2]
        return a + b * prefill_tokens, a + c * decode_rows


class EngineStats:
    def __init__(self, keep_records=None):
        # A long-lived engine (the server) keeps only its latest records; the totals count every step.
        self.keep_records = keep_records
        self.reset()

    def reset(self):
        self.records = []
        self.origin = time.perf_counter()
        self.model = CostModel()
        self.by_tag = {}  # (tag, phase) -> [rows, tokens, ns]
        self.rules = dict.fromkeys(RULES, 0)  # mixed steps split by each rule
        self._end_ns = 0
        self.totals = dict(prefill_tokens=0, decode_tokens=0, cached_tokens=0, cache_hits=0, ns=0, prefill_ns=0,
                           decode_ns=0, steps=0, max_batch_seqs=0, max_batch_tokens=0, max_kv_blocks=0,
                           preemptions=0, requests=0, draft_tokens=0, accepted_draft_tokens=0,
                           shared_decode_tokens=0, shared_prefill_tokens=0)

    def record(self, start, seconds, rows, num_seqs, kv_blocks_used, cached_tokens, cache_hits, phase_seconds=None):
        """One forward pass. rows: (tag, phase, num_tokens[, request id]) per scheduled sequence;
        phase_seconds: {"prefill": s, "decode": s} when the two phases ran as separately timed passes."""
        groups = {}
        for tag, phase, n, *_ in rows:
            if phase not in PHASES:
                raise ValueError(f"unknown phase {phase!r}")
            g = groups.setdefault((tag, phase), [0, 0])
            g[0] += 1
            g[1] += n
        tokens = {phase: sum(g[1] for (_, ph), g in groups.items() if ph == phase) for phase in PHASES}
        p, d = tokens["prefill"], tokens["decode"]
        ns = max(0, round(seconds * 1e9))
        costs = None
        if not (p and d):
            attribution, weights = "pure", (p, d)
            if p or d:
                self.model.add("prefill" if p else "decode", p, d, seconds)
        elif phase_seconds and phase_seconds.get("prefill", 0) > 0 and phase_seconds.get("decode", 0) > 0:
            attribution, weights = "measured", (phase_seconds["prefill"], phase_seconds["decode"])
        elif (costs := self.model.costs(p, d)) is not None:
            attribution, weights = "model", costs
        else:
            attribution, weights = "token share", (p, d)
        if attribution != "pure":
            self.rules[attribution] += 1
        prefill_ns = round(ns * weights[0] / (weights[0] + weights[1])) if weights[0] else 0
        phase_ns = {"prefill": prefill_ns, "decode": ns - prefill_ns}

        tags = []
        for phase in PHASES:  # each phase's time shared among its rows by tokens
            keys = [k for k in groups if k[1] == phase]
            for key, part in zip(keys, split(phase_ns[phase], [groups[k][1] for k in keys])):
                tags.append([key[0], phase, groups[key][0], groups[key][1], part])
                total = self.by_tag.setdefault(key, [0, 0, 0])
                total[0] += groups[key][0]
                total[1] += groups[key][1]
                total[2] += part

        t = self.totals
        t["steps"] += 1
        t["prefill_tokens"] += p
        t["decode_tokens"] += d
        t["cached_tokens"] += cached_tokens
        t["cache_hits"] += cache_hits
        t["ns"] += ns
        t["prefill_ns"] += phase_ns["prefill"]
        t["decode_ns"] += phase_ns["decode"]
        t["max_batch_seqs"] = max(t["max_batch_seqs"], num_seqs)
        t["max_batch_tokens"] = max(t["max_batch_tokens"], p + d)
        t["max_kv_blocks"] = max(t["max_kv_blocks"], kv_blocks_used)
        # Steps run one after another; rounding to ns must not make them overlap in a trace.
        start_ns = max(round((start - self.origin) * 1e9), self._end_ns)
        self._end_ns = start_ns + ns
        self.records.append(StepRecord(
            t["steps"], start_ns, ns, phase_ns["prefill"], phase_ns["decode"], attribution,
            "decode" if not p else "prefill" if not d else "mixed", num_seqs, p, d, kv_blocks_used,
            cached_tokens, cache_hits, tags, [row[3] for row in rows if len(row) > 3]))
        if self.keep_records is not None and len(self.records) >= 2 * self.keep_records:
            del self.records[:len(self.records) - self.keep_records]  # trimmed in batches: amortised O(1)

    def attribution(self):
        """The rule(s) that split this run's mixed steps."""
        used = [rule for rule in RULES if self.rules[rule]]
        return ", ".join(used) if used else "none (no mixed steps)"

    def tag_table(self):
        """Per (tag, phase): rows, tokens, seconds, tokens/s, share of the run's seconds."""
        run = self.totals["ns"]
        return [dict(tag=tag, phase=phase, rows=rows, tokens=tokens, seconds=ns / 1e9,
                     tok_per_s=tokens / (ns / 1e9) if ns else 0.0, share=ns / run if run else 0.0)
                for (tag, phase), (rows, tokens, ns) in sorted(
                    self.by_tag.items(), key=lambda item: (str(item[0][0]), PHASES.index(item[0][1])))]

    def summary(self):
        t = dict(self.totals)
        t["seconds"] = t.pop("ns") / 1e9
        t["prefill_seconds"] = t.pop("prefill_ns") / 1e9
        t["decode_seconds"] = t.pop("decode_ns") / 1e9
        t["prefill_tok_per_s"] = t["prefill_tokens"] / t["prefill_seconds"] if t["prefill_seconds"] else 0.0
        t["decode_tok_per_s"] = t["decode_tokens"] / t["decode_seconds"] if t["decode_seconds"] else 0.0
        t["mixed_steps"] = dict(self.rules)
        t["attribution"] = self.attribution()
        t["by_tag"] = self.tag_table()
        return t

    def to_json(self, path=None, **extra):
        data = {**extra, "summary": self.summary(), "steps": [r.to_dict() for r in self.records]}
        if path is not None:
            with open(path, "w") as f:
                json.dump(data, f, indent=1)
        return data

    def to_chrome_trace(self, path, name="engine", metadata=None):
        """Write the steps as a Chrome trace (Perfetto, chrome://tracing): one track of steps, one of
        prefill and one of decode (each step's attributed time, laid end to end inside the step; a slice
        per tag inside, the tag as its category), counters of sequences and KV blocks in use, and each
        request as a flow through the steps it took part in."""
        def us(ns):
            return ns / 1000  # integer ns -> us: Perfetto reads back the same integer ns
        events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": name}}]
        for tid, track in enumerate(("steps", "prefill", "decode")):
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": track}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid, "args": {"sort_index": tid}})
        for r in self.records:
            args = {k: v for k, v in r.to_dict().items() if k not in ("start_ns", "start", "tags")}
            events.append({"name": r.phase, "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": us(r.start_ns),
                           "dur": us(r.ns), "args": args})
            at = r.start_ns
            for tid, phase in enumerate(PHASES, 1):
                length = r.prefill_ns if phase == "prefill" else r.decode_ns
                if not length:
                    continue
                rows = [t for t in r.tags if t[1] == phase]
                events.append({"name": phase, "cat": phase, "ph": "X", "pid": 0, "tid": tid, "ts": us(at),
                               "dur": us(length), "args": {"step": r.step, "tokens": sum(t[3] for t in rows),
                                                           "rows": sum(t[2] for t in rows)}})
                inner = at
                for tag, _, n_rows, tokens, ns in rows:
                    if ns:
                        label = "untagged" if tag is None else str(tag)
                        events.append({"name": label, "cat": label, "ph": "X", "pid": 0, "tid": tid, "ts": us(inner),
                                       "dur": us(ns), "args": {"rows": n_rows, "tokens": tokens}})
                    inner += ns
                at += length
            events.append({"name": "sequences", "ph": "C", "pid": 0, "ts": us(r.start_ns),
                           "args": {"sequences": r.num_seqs}})
            events.append({"name": "kv blocks", "ph": "C", "pid": 0, "ts": us(r.start_ns),
                           "args": {"used": r.kv_blocks_used}})
        events += _request_flows(self.records, us)
        trace = {"traceEvents": events, "displayTimeUnit": "ms",
                 "otherData": {"summary": self.summary(), **({"engine": metadata} if metadata else {})}}
        with open(path, "w") as f:
            json.dump(trace, f, default=str)
        return trace


def _request_flows(records, us):
    """Flow events (arrows in Perfetto) that follow each request from the first step slice it was in
    to the last, bound to the step slices they fall inside."""
    steps_of = {}
    for r in records:
        for request in dict.fromkeys(r.requests):
            steps_of.setdefault(request, []).append(r)
    events = []
    for request, steps in steps_of.items():
        if len(steps) < 2:
            continue
        for i, r in enumerate(steps):
            ph = "s" if i == 0 else "f" if i == len(steps) - 1 else "t"
            events.append({"name": "request", "cat": "request", "ph": ph, "id": request, "pid": 0, "tid": 0,
                           "ts": us(r.start_ns + r.ns // 2), "bp": "e"})
    return events

