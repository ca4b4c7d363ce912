"""The experiment runner: many problem instances at once, one JSONL line per instance, resumable.

    records = run_instances(items, solve, out="runs/x", key=lambda t: t.id,
                            summarize=lambda records: {"accuracy": ...}, stats=lambda: llm.stats)

`solve(item)` is an `async def` over ONE instance (a protocol on one problem); up to `concurrency`
of them are in flight together, so the engine batches their requests. Each result (a dataclass or a
dict) is appended to OUT/results.jsonl as `{"id": ..., **result}` and flushed the moment its instance
finishes. A rerun with the same OUT skips the ids already there, so a crash or Ctrl-C loses only the
instances in flight; a line cut short by a crash is dropped (that instance runs again). At the end,
and on Ctrl-C, OUT/summary.json receives `summarize(records)` over every record in the file.

An instance whose `solve` raises does not end the run: its line is an error row,
`{"id": ..., "error": {"type", "message", "traceback"}}`, the others go on, and summary.json counts
it (`errors`, `failed`) but `summarize` never sees it. A rerun with the same OUT runs it again and
replaces its row. Ctrl-C (KeyboardInterrupt) and cancellation still stop the run.

On replicas (a Ray pool's placement: `placement=`, or the pool whose `with` block the run starts in),
each instance is bound to one replica of each model for its whole life (its sessions live there): the
one with the fewest instances in flight, up to `concurrency` per replica. An instance whose replica
died runs again on another (at most MAX_ATTEMPTS times); summary.json's "ray" says which replica ran
how many instances and how many were retried. Rows are the same wherever an instance ran.
"""
import asyncio
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

from .progress import bar_format

RESULTS, SUMMARY, COSTS = "results.jsonl", "summary.json", "costs.jsonl"
COUNTED = ("decode_tokens", "prefill_tokens", "cached_tokens", "prefill_seconds", "decode_seconds")
MAX_ATTEMPTS = 3  # runs of one instance on replicas that keep dying, before it becomes an error row


def to_json(value):
    """Dataclasses, tuples, sets, paths and non-finite floats made JSON-safe (recursively)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def read_results(out) -> list[dict]:
    """The complete records of OUT/results.jsonl. A damaged line (a crash mid-write) is dropped, and
    the file rewritten without it, so that appending goes on from a clean line boundary."""
    path = Path(out) / RESULTS
    if not path.exists():
        return []
    raw = path.read_bytes()
    records, bad = [], 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(record, dict) and "id" in record:
            records.append(record)
        else:
            bad += 1
    if bad or (raw and not raw.endswith(b"\n")):
        _rewrite(path, records)
        if bad:
            print(f"byzantium: dropped {bad} damaged line(s) of {path}; those instances run again",
                  file=sys.stderr)
    return records


def _rewrite(path, records):
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)  # never a half-written file


def is_error(record) -> bool:
    """Is this line an instance that raised (to be run again on resume, left out of every metric)?"""
    return isinstance(record.get("error"), dict)


def split_errors(records):
    """(the records that are results, the ids of the error rows)."""
    return [r for r in records if not is_error(r)], [r["id"] for r in records if is_error(r)]


def error_record(i, exc) -> dict:
    """The error row of instance `i`: exception type, message and the innermost frames."""
    frames = traceback.extract_tb(exc.__traceback__)[-8:]
    return {"id": i, "error": {"type": type(exc).__name__, "message": str(exc),
                               "traceback": [f"{f.filename}:{f.lineno} in {f.name}" for f in frames]}}


def write_summary(out, summary):
    path = Path(out) / SUMMARY
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(to_json(summary), indent=1) + "\n")
    os.replace(tmp, path)  # never a half-written summary
    return path


def check_resume(out, config):
    """Refuse to resume into an OUT whose summary was written for a different configuration."""
    path = Path(out) / SUMMARY
    if config is None or not path.exists():
        return
    try:
        old = json.loads(path.read_text()).get("config")
    except ValueError:
        return
    if old is not None and old != to_json(config):
        diff = sorted(k for k in set(old) | set(to_json(config)) if old.get(k) != to_json(config).get(k))
        raise ValueError(f"{out} holds results of a different configuration (differs in: {', '.join(diff)}); "
                         f"use another --out")


def _counters(stats):
    try:
        got = (stats() or {}) if stats else {}
        return {k: got.get(k, 0) or 0 for k in COUNTED}
    except Exception:  # stats are a nicety; never let them stop a run
        return {k: 0 for k in COUNTED}


def add_cost(out, ids, seconds, before, after):
    """Append one invocation's cost (its instances, wall seconds, the engine counters it moved) to
    OUT/costs.jsonl, kept apart from results.jsonl so that the results are the same bytes on any run.
    Returns every invocation's total: a resumed run counts the instances of each of its invocations."""
    path = Path(out) / COSTS
    line = {"ids": list(ids), "seconds": seconds, **{k: after[k] - before[k] for k in COUNTED}}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
    total = {"invocations": 0, "instances": 0, "seconds": 0.0, **{k: 0 for k in COUNTED}}
    for raw in path.read_text().splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        total["invocations"] += 1
        total["instances"] += len(entry.get("ids") or [])
        for k in ("seconds", *COUNTED):
            total[k] += entry.get(k) or 0
    return total


def _tokens(stats):
    try:
        return int((stats() or {}).get("decode_tokens", 0)) if stats else 0
    except Exception:  # stats are a progress nicety; never let them stop a run
        return 0


class Placed:
    """The run's side of a placement (replicas): binds each instance, runs it again when a replica it was
    bound to died, and counts what each replica ran in this run (for progress and summary.json)."""

    def __init__(self, placement, concurrency):
        self.placement, self.concurrency = placement, concurrency
        self.ran, self.retried = {}, set()  # replica id -> instances finished on it; ids run again
        self.start, self.tokens0 = time.perf_counter(), placement.tokens()

    async def run(self, solve, item, i, say):
        for attempt in range(1, MAX_ATTEMPTS + 1):
            binding = await self.placement.acquire(self.concurrency)
            try:
                with binding.active():
                    result = await solve(item)
                error = None
            except Exception as exc:
                error = exc
            finally:
                self.placement.release(binding)
            if not binding.lost:  # a result, or an error of the instance itself
                if error is not None:
                    raise error
                for r in binding.replicas.values():
                    self.ran[r.id] = self.ran.get(r.id, 0) + 1
                return result
            # its replica died: even a result is not trusted (a protocol may have swallowed the error)
            if attempt == MAX_ATTEMPTS:
                raise error or RuntimeError(f"instance {i}: its replicas died {MAX_ATTEMPTS} times")
            self.retried.add(i)
            say(f"byzantium: instance {i} lost its replica; running it again (attempt {attempt + 1})")

    def postfix(self):
        """Instances/s and generated tokens/s per replica."""
        seconds = max(time.perf_counter() - self.start, 1e-9)
        tokens = self.placement.tokens()
        return " | ".join(f"{r.id}{'' if r.alive else ' (dead)'} {self.ran.get(r.id, 0) / seconds:.2f} inst/s "
                          f"{(tokens[r.id] - self.tokens0.get(r.id, 0)) / seconds:.1f} tok/s"
                          for r in self.placement.replica_list() if r.alive or self.ran.get(r.id))

    def report(self):
        return {self.placement.name: {
            "replicas": [{"id": r.id, "model": r.llm.name, "node": r.node, "ip": r.ip, "alive": r.alive,
                          "instances": self.ran.get(r.id, 0)} for r in self.placement.replica_list()],
            "retried_instances": len(self.retried)}}


async def run_async(items, solve, out, key=None, concurrency=64, stats=None, desc="instances", progress=True,
                    placement=None, report=None):
    """Run `solve` over the items not yet in OUT (or whose row is an error); returns (records before,
    rows added now, error rows included). placement: replicas to bind instances to (default: the Ray
    pool's in scope, if any); report: a dict that receives the placement's report."""
    from tqdm.auto import tqdm

    from ..backends import current_placement

    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    placement = placement if placement is not None else current_placement()
    placed = Placed(placement, concurrency) if placement is not None else None
    key = key or (lambda item: item.id)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = [str(key(item)) for item in items]
    if len(set(ids)) != len(ids):
        raise ValueError("instance ids are not unique")
    done = read_results(out)
    retry = {r["id"] for r in done if is_error(r)} & set(ids)
    if retry:  # instances that raised last time run again; their new rows replace the error rows
        done = [r for r in done if r["id"] not in retry]
        _rewrite(out / RESULTS, done)
    seen = {r["id"] for r in done}
    todo = [(i, item) for i, item in zip(ids, items) if i not in seen]
    added = []
    initial = len(items) - len(todo)
    bar = tqdm(total=len(items), initial=initial, desc=desc, unit="inst",
               disable=not progress, dynamic_ncols=True, bar_format=bar_format(False))
    start, tokens0 = time.perf_counter(), _tokens(stats)
    # Instances that all start at once end together, near the end: a time left from the first of them to
    # end says nothing. It is shown once instances finished in this run and they go through in waves.
    waves = placed is not None or len(todo) > concurrency

    def tick():
        rate = (_tokens(stats) - tokens0) / max(time.perf_counter() - start, 1e-9)
        bar.bar_format = bar_format(waves and bar.n > initial)
        bar.set_postfix_str(f"{rate:.1f} gen tok/s" + (f"; {placed.postfix()}" if placed else ""), refresh=False)
        bar.refresh()

    async def ticker():  # keeps tokens/s moving while long instances run
        while True:
            await asyncio.sleep(1.0)
            tick()

    limit = asyncio.Semaphore(concurrency)

    async def one(i, item, f):
        try:
            if placed is not None:  # its limit is per replica
                result = await placed.run(solve, item, i, lambda text: bar.write(text, file=sys.stderr))
            else:
                async with limit:
                    result = await solve(item)
            record = {"id": i, **{k: v for k, v in to_json(result).items() if k != "id"}}
        except Exception as exc:  # one bad instance is a row; Ctrl-C and cancellation are no Exception: they stop
            record = error_record(i, exc)
            bar.write(f"byzantium: instance {i} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        f.write(json.dumps(record) + "\n")
        f.flush()  # on disk as soon as the instance finishes
        added.append(record)
        bar.update(1)
        tick()

    ticking = asyncio.create_task(ticker()) if progress else None
    try:
        with open(out / RESULTS, "a") as f:
            tasks = [asyncio.create_task(one(i, item, f)) for i, item in todo]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        if ticking:
            ticking.cancel()
        bar.close()
        if placed is not None and report is not None:
            report.update(placed.report())
    return done, added


def build_wait_seconds() -> float:
    """Seconds this process has waited for another process's CPU-kernel build (kernels/cpu_ext.py), which
    a run's wall seconds leave out; read without importing it (not imported: nothing was waited for)."""
    ext = sys.modules.get("byzantium.kernels.cpu_ext")
    return ext.waited_seconds() if ext is not None else 0.0


def run_instances(items, solve, out, key=None, concurrency=64, stats=None, summarize=None, config=None,
                  desc="instances", progress=True, placement=None):
    """Synchronous entry point; writes OUT/summary.json and returns every result (old and new; error
    rows left out: summary.json counts them as `errors` and lists their ids as `failed`).

    On Ctrl-C the summary of what is done is written (`"complete": false`) and KeyboardInterrupt
    re-raised; rerun with the same OUT to finish."""
    check_resume(out, config)
    start, waited = time.perf_counter(), build_wait_seconds()
    counters = _counters(stats)
    complete = False
    added = []
    placed = {}  # the placement's report (replicas, retries), when there is one
    try:
        done, added = asyncio.run(run_async(items, solve, out, key, concurrency, stats, desc, progress, placement,
                                            placed))
        complete = True
        # Rows were appended as instances finished, an order that timing decides: put them in the items'
        # order, so that the same run writes the same file.
        rank = {str((key or (lambda item: item.id))(item)): n for n, item in enumerate(items)}
        rows = read_results(out)
        ordered = sorted(rows, key=lambda r: rank.get(r["id"], len(rank)))
        if ordered != rows:
            _rewrite(Path(out) / RESULTS, ordered)
    except KeyboardInterrupt:
        print(f"\nbyzantium: interrupted; finished instances are in {Path(out) / RESULTS}; "
              f"rerun with the same output directory to resume", file=sys.stderr)
        raise
    finally:
        records = read_results(out) if Path(out).exists() else []
        wanted = {str((key or (lambda item: item.id))(item)) for item in items}
        records, failed = split_errors([r for r in records if r["id"] in wanted])
        summary = dict(summarize(records)) if summarize else {}
        seconds = time.perf_counter() - start - (build_wait_seconds() - waited)  # not another's kernel build
        cost = add_cost(out, [r["id"] for r in added], seconds, counters, _counters(stats)) if Path(out).exists() else None
        summary.update(cost=cost, config=config, instances=len(records), errors=len(failed), failed=failed, total=len(items),
                       complete=complete and len(records) == len(items),
                       seconds=seconds, **placed)
        write_summary(out, summary)
    if failed:
        print(f"byzantium: {len(failed)} of {len(items)} instances failed ({', '.join(failed[:5])}"
              f"{', ...' if len(failed) > 5 else ''}); their rows in {Path(out) / RESULTS} say why; rerun with the "
              f"same output directory to run them again", file=sys.stderr)
    return records


__all__ = ["RESULTS", "SUMMARY", "MAX_ATTEMPTS", "Placed", "to_json", "read_results", "is_error", "split_errors", "error_record",
           "write_summary", "check_resume", "run_async", "run_instances"]
