"""Running a sweep: every cell not done yet into DIR/<cell name>/, one after another, each an ordinary
`byzantium run <method>` on the shared pool (each runs up to its --concurrency instances at once, which
the engine batches). A rerun with the same DIR skips what is done (the runner's resume rules, per
cell). A cell that fails (a model not on this machine, a bad data file, a context too short) is marked
failed in DIR/sweep.json with its message, and the sweep goes on; Ctrl-C stops it, and a rerun resumes.

DIR/sweep.json (written at the start, after each cell and at the end) is what `byzantium report` reads:
    {"name", "paper", "table", "scale", "config", "limit", "analysis": {...},
     "cells": [{"name", "dir", "method", "params": {...}, "status": "pending"|"done"|"failed", "error"}],
     "published": [{"table", "method", "metric", "value", ["value_max", "unit"], "where": {...}, "source"}]}
"""
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

from ..experiments.run_command import run_parser
from ..experiments.runner import RESULTS, SUMMARY, to_json
from .needs import cell_problem
from .pool import SharedPool
from .progress import Progress

SWEEP = "sweep.json"


def check_limit(out, limit):
    """Refuse a rerun into OUT with another --limit than the one recorded: a cell done at one limit would
    count as done at the other, and the report would mix the two."""
    try:
        old = json.loads((Path(out) / SWEEP).read_text()).get("limit")  # older sweeps: no key, no --limit
    except (OSError, ValueError):
        return
    if old != limit:
        said = lambda n: "no --limit" if n is None else f"--limit {n}"  # noqa: E731
        raise ValueError(f"{out} was swept with {said(old)}, this run has {said(limit)}: its finished cells "
                         f"would count as done with the other number of problems. Rerun with {said(old)} to "
                         "resume, or use another --out")


def cell_status(path):
    """done when the cell's summary says every instance finished without error; else pending."""
    try:
        summary = json.loads((Path(path) / SUMMARY).read_text())
    except (OSError, ValueError):
        return "pending"
    return "done" if summary.get("complete") and not summary.get("errors") else "pending"


def sweep_json(sweep, states, limit=None) -> dict:
    cells = []
    for cell in sweep.cells:
        status, error = states[cell.name]
        cells.append({"name": cell.name, "dir": cell.name, "method": cell.method, "params": cell.params,
                      "status": status, **({"error": error} if error else {})})
    return {"name": sweep.name, "paper": sweep.paper, "table": sweep.table, "scale": sweep.scale,
            "config": str(sweep.path), "limit": limit, "analysis": sweep.analysis, "cells": cells,
            "published": sweep.published}


def write_json(path, data):
    tmp = Path(path).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(to_json(data), indent=1) + "\n")
    os.replace(tmp, path)


def run_cell(cell, flags, path, pool):
    """One cell: `byzantium run <method> ... --out path` with the shared pool (which gives each model its
    [models] engine settings), its output to run.log."""
    args = run_parser().parse_args(cell.argv + list(flags) + ["--out", str(path)])
    args.pool = pool
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "run.log", "a") as log, contextlib.redirect_stdout(log):
        args.func(args)


def run_sweep(sweep, out, flags=("--no-progress",), backend="native", progress=True, factory=None, limit=None):
    """Run every cell not done yet into OUT/<cell name>/; returns sweep.json's data. factory: the pool
    class (default LLMPool); limit: the --limit the cells were given (apply_limit), recorded."""
    out = Path(out)
    check_limit(out, limit)
    out.mkdir(parents=True, exist_ok=True)
    flags = list(flags)
    states = {c.name: (cell_status(out / c.name), None) for c in sweep.cells}
    write_json(out / SWEEP, sweep_json(sweep, states, limit))
    problems = {c.name: cell_problem(sweep, c, backend) for c in sweep.cells if states[c.name][0] != "done"}
    for problem in dict.fromkeys(p for p in problems.values() if p):  # once per reason, not per cell
        count = sum(p == problem for p in problems.values())
        print(f"byzantium: {count} cell(s) cannot run here: {problem}", file=sys.stderr)
    runnable = [m for c in sweep.cells if states[c.name][0] != "done" and not problems[c.name] for m in c.models]
    pool = SharedPool(list(dict.fromkeys(runnable)), sweep.models, factory)
    bar = Progress(sweep, out, states, pool, progress, skip={name for name, p in problems.items() if p})
    try:
        for cell in sweep.cells:
            if states[cell.name][0] == "done":
                continue
            if problems[cell.name]:  # said above
                states[cell.name] = ("failed", problems[cell.name])
                write_json(out / SWEEP, sweep_json(sweep, states, limit))
                continue
            pool.next, bar.current = cell.models, cell
            try:
                run_cell(cell, flags, out / cell.name, pool)
                status = cell_status(out / cell.name)
                states[cell.name] = (status, None) if status == "done" else (
                    "failed", f"some instances failed: their rows in {cell.name}/{RESULTS} say why; rerun to retry")
            except KeyboardInterrupt:
                states[cell.name] = ("pending", None)
                raise
            except Exception as error:  # one cell's failure is its status; the sweep goes on
                (out / cell.name).mkdir(parents=True, exist_ok=True)
                with open(out / cell.name / "run.log", "a") as log:
                    traceback.print_exc(file=log)
                states[cell.name] = ("failed", f"{type(error).__name__}: {error}")
            bar.cell_finished(cell, states[cell.name][0])
            if states[cell.name][0] == "failed":
                bar.bar.write(f"byzantium: cell {cell.name} failed: {states[cell.name][1]}", file=sys.stderr)
            write_json(out / SWEEP, sweep_json(sweep, states, limit))
    finally:
        bar.close()
        pool.close()
        write_json(out / SWEEP, sweep_json(sweep, states, limit))
    counts = {s: sum(v == s for v, _ in states.values()) for s in ("done", "failed", "pending")}
    print(f"{counts['done']} of {len(sweep.cells)} cells done, {counts['failed']} failed"
          + (" (their errors are in sweep.json; rerun to retry)" if counts["failed"] else "")
          + f"; the tables: byzantium report {out}")
    return sweep_json(sweep, states, limit)
