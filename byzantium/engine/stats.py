"""Per-step records of the engine (phase, tokens, cached tokens, seconds), their totals, and exports.

A step that prefills anything counts as a prefill step for the seconds totals (its decode rows ride
along); `decode_seconds` is the time of pure decode steps. Token counts are always split exactly.
"""
import json
import time
from dataclasses import asdict, dataclass


@dataclass
class StepRecord:
    step: int
    start: float  # seconds since the stats were reset
    seconds: float
    phase: str  # "prefill", "decode" or "mixed"
    num_seqs: int
    prefill_tokens: int
    decode_tokens: int
    cached_tokens: int  # prompt tokens that requests admitted in this step found in the prefix cache


class EngineStats:
    def __init__(self):
        self.reset()

    def reset(self):
        self.records = []
        self.origin = time.perf_counter()
        self.totals = dict(prefill_tokens=0, decode_tokens=0, cached_tokens=0, prefill_seconds=0.0,
                           decode_seconds=0.0, steps=0, max_batch_seqs=0, max_batch_tokens=0,
                           preemptions=0, requests=0)

    def record(self, start, seconds, num_seqs, prefill_tokens, decode_tokens, cached_tokens):
        phase = "decode" if not prefill_tokens else "prefill" if not decode_tokens else "mixed"
        t = self.totals
        t["steps"] += 1
        t["prefill_tokens"] += prefill_tokens
        t["decode_tokens"] += decode_tokens
        t["cached_tokens"] += cached_tokens
        t["prefill_seconds" if prefill_tokens else "decode_seconds"] += seconds
        t["max_batch_seqs"] = max(t["max_batch_seqs"], num_seqs)
        t["max_batch_tokens"] = max(t["max_batch_tokens"], prefill_tokens + decode_tokens)
        self.records.append(StepRecord(t["steps"], start - self.origin, seconds, phase, num_seqs,
                                       prefill_tokens, decode_tokens, cached_tokens))

    def summary(self):
        t = dict(self.totals)
        t["prefill_tok_per_s"] = t["prefill_tokens"] / t["prefill_seconds"] if t["prefill_seconds"] else 0.0
        t["decode_tok_per_s"] = t["decode_tokens"] / t["decode_seconds"] if t["decode_seconds"] else 0.0
        return t

    def to_json(self, path=None):
        data = {"summary": self.summary(), "steps": [asdict(r) for r in self.records]}
        if path is not None:
            with open(path, "w") as f:
                json.dump(data, f, indent=1)
        return data

    def to_chrome_trace(self, path):
        """Write the steps as a Chrome trace (open in Perfetto or chrome://tracing)."""
        events = [{"name": r.phase, "ph": "X", "pid": 0, "tid": 0, "ts": r.start * 1e6, "dur": r.seconds * 1e6,
                   "args": {k: v for k, v in asdict(r).items() if k not in ("start", "seconds", "phase")}}
                  for r in self.records]
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
