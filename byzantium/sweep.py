"""`byzantium sweep FILE.toml --out DIR`: every cell of an experiment file (sweep_config.py), each an
ordinary `byzantium run <method>` into DIR/<cell name>/, one engine per model for the whole sweep.

    byzantium sweep ct_table1 --out runs/ct1                      # a shipped file by name; smoke scale
    byzantium sweep my.toml --out runs/x --scale paper --data-root ~/data --dry-run   # what it needs

Cells run one after another (each runs up to its --concurrency instances at once, which the engine
batches). A rerun with the same DIR skips what is done (the runner's resume rules, per cell). A cell
that fails (a model not on this machine, a bad data file, a context too short) is marked failed in
DIR/sweep.json with its message, and the sweep goes on; Ctrl-C stops it, and a rerun resumes.

DIR/sweep.json (written at the start, after each cell and at the end) is what `byzantium report` reads:
    {"name", "paper", "table", "scale", "config", "analysis": {...},
     "cells": [{"name", "dir", "method", "params": {...}, "status": "pending"|"done"|"failed", "error"}],
     "published": [{"table", "method", "metric", "value", ["value_max", "unit"], "where": {...}, "source"}]}
"""
import contextlib
import functools
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from .experiments.runner import RESULTS, SUMMARY, to_json
from .sweep_config import ConfigError, load_sweep, local_model, model_context, needed_len, parse_cell, short_model

SWEEP = "sweep.json"
NOT_HERE = ("is not on this machine (no checkpoint directory, not in the Hugging Face cache): download it "
            "(huggingface-cli download NAME) for a GPU with the weights, or serve it and pass "
            "--backend openai --base-url URL")


def add_sweep_args(ap):
    from .backends import add_backend_args
    ap.add_argument("file", help="an experiment file (TOML), or the name of a shipped one (byzantium/experiments/"
                                 "configs/: sac_table3_4, ct_table1, mas_main, ...)")
    ap.add_argument("--out", required=True, help="output directory: DIR/sweep.json and DIR/<cell>/")
    ap.add_argument("--scale", choices=("smoke", "paper"), default="smoke",
                    help="smoke (default): the embedded model, a few questions, short answers (minutes on a CPU); "
                         "paper: the paper's models and sizes (GPUs)")
    ap.add_argument("--dry-run", action="store_true",
                    help="list the cells, their models, which backend would serve them and the context they need")
    ap.add_argument("--data-root", default=None, metavar="DIR",
                    help="the directory of the data files the experiment names (default: the file's data_root)")
    add_backend_args(ap)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_flags(args):
    """The sweep's backend and device flags, as every cell's `run` gets them (each flag that
    add_backend_args defines, so that flags added there travel too)."""
    import argparse
    from .backends import add_backend_args
    ap = argparse.ArgumentParser(add_help=False)
    add_backend_args(ap)
    ap.add_argument("--device")
    ap.add_argument("--dtype")
    flags = ["--no-progress"]
    for action in ap._actions:
        value = getattr(args, action.dest, None)
        if value == action.default:
            continue
        if action.nargs == 0 or (action.nargs == "?" and value == action.const):  # --enforce-eager, --ray
            flags.append(action.option_strings[0])
        else:
            flags += [action.option_strings[0], str(value)]
    return flags


def cmd_sweep(args):
    try:
        sweep = load_sweep(args.file, args.scale, args.data_root, check_files=True)
    except ConfigError as error:
        raise ValueError(str(error)) from None
    from .backends import pool_kwargs
    pool_kwargs(args)  # the backend flags' own checks (--backend openai needs --base-url, ...)
    flags = run_flags(args)
    for cell in sweep.cells:  # each cell with them, before anything loads
        parse_cell(cell, sweep.path.name, flags)
    if args.dry_run:
        print(describe(sweep, args.backend))
        return
    result = run_sweep(sweep, args.out, flags, backend=args.backend, progress=not args.no_progress)
    return 1 if any(cell["status"] == "failed" for cell in result["cells"]) else 0  # scripts see failed cells


# ---------------------------------------------------------------------------------------- checks

def serving(name, backend):
    """Which backend would serve a model, in words."""
    if backend == "openai":
        return "the server at --base-url"
    where = local_model(name)
    if where is not None:
        return f"the local engine ({where})"
    return "not here: needs --backend openai --base-url ... or a GPU with the weights"


def hub_dataset(cell):
    """The Hugging Face hub id a cell's questions would be downloaded from (a dataset name as its task
    and no data file), or None."""
    from .tasks import HUB
    if "--data" in cell.argv or "--task" not in cell.argv:
        return None
    base = cell.argv[cell.argv.index("--task") + 1].split(":")[0]
    return HUB[base][0] if base in HUB else None


def hub_offline():
    """Whether the environment forbids the hub (the variables `datasets` and huggingface_hub obey)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_cached(hub_id):
    """Whether a hub dataset is in the local caches (huggingface_hub's or `datasets`'), looked up on disk
    only: a dry run makes no network call. Paths from the environment at call time (as the libraries
    read it at import)."""
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    hub = Path(os.environ.get("HF_HUB_CACHE") or home / "hub").expanduser()
    data = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    return (hub / f"datasets--{hub_id.replace('/', '--')}").is_dir() or (data / hub_id.replace("/", "___")).is_dir()


def hub_note(cell):
    """The dry run's word on a download the run would make (offline, cell_problem says it cannot)."""
    hub_id = hub_dataset(cell)
    if hub_id is None or hub_offline() or hub_cached(hub_id):
        return ""
    return (f"  [needs the Hugging Face hub: {hub_id} is not in the local cache, downloaded at run time; "
            f"without network give the task a data file]")


def cell_problem(sweep, cell, backend):
    """Why the cell cannot run here (a message), or None."""
    hub_id = hub_dataset(cell)
    if hub_id is not None and hub_offline() and not hub_cached(hub_id):
        return (f"cannot run here: its questions need the Hugging Face hub ({hub_id}), not in the local cache, "
                f"and the hub is off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); give the task a data file")
    for name in cell.models:
        if backend != "openai" and local_model(name) is None:
            return f"model {name!r} {NOT_HERE}"
    need = needed_len(cell, sweep.prompt_budget)
    for name in cell.models:
        limit = model_context(name, sweep.models)
        if limit is not None and need > limit:
            return (f"needs max_model_len {need} (prompt budget {sweep.prompt_budget} + generation) but model "
                    f"{name or 'smollm2-135m'!r} has a context of {limit}; shorten max_len/max_tokens")
    return None


def describe(sweep, backend="native") -> str:
    """The dry run's listing: cells, models, who serves them, the context each cell needs."""
    lines = [f"{sweep.path.name}: {sweep.paper} {sweep.table}, scale {sweep.scale}: {len(sweep.cells)} cells",
             f"{'cell':<48} {'method':<10} {'needs len':>9}  models"]
    for cell in sweep.cells:
        models = ", ".join(short_model(m) for m in cell.models)
        problem = cell_problem(sweep, cell, backend)
        lines.append(f"{cell.name:<48} {cell.method:<10} {needed_len(cell, sweep.prompt_budget):>9}  {models}"
                     + ("  [cannot run here: see its model below]" if problem and problem.startswith("model ")
                        else f"  [{problem}]" if problem else "") + hub_note(cell))
    lines.append("models:")
    for name in dict.fromkeys(m for cell in sweep.cells for m in cell.models):
        how = serving(name, backend)
        need = max(needed_len(c, sweep.prompt_budget) for c in sweep.cells if name in c.models)
        context = model_context(name, sweep.models)
        kwargs = sweep.models.get(str(name), {}).get("chat_template_kwargs")
        lines.append(f"  {name or 'smollm2-135m (embedded)'}: {how}; max_model_len needed {need}"
                     + (f" (context {context})" if context else "")
                     + (f"; chat_template_kwargs {json.dumps(kwargs)}" if kwargs else ""))
    lines.append(f"needed length = prompt budget ({sweep.prompt_budget} tokens, an estimate) + what the cell "
                 "generates after it; see sweep_config.needed_len")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- the pool

class SharedPool:
    """One LLMPool for the whole sweep. A cell's `run_pool(args, ...)` calls this (args.pool) and gets a
    Borrowed view whose `with` does not close the engines; `close()` at the end of the sweep does.
    It plans the device for every model of the sweep at once; when they do not fit together, it plans
    the next cell's models only and reloads when a cell needs others (load_sweep puts the cells of one
    model set next to each other)."""

    def __init__(self, models, settings, factory=None):
        self.models, self.settings, self.factory = list(models), settings, factory
        self.pool, self.planned, self.next = None, set(), []

    def __call__(self, backend, **kwargs):
        need = set(self.next)
        if self.pool is not None and not need <= self.planned:
            self.pool.close()
            self.pool = None
        if self.pool is None:
            from .backends import LLMPool
            self.pool = (self.factory or LLMPool)(backend, **kwargs)
            try:
                self.pool.plan(self.models)
                self.planned = set(self.models)
            except ValueError:  # together they do not fit on the device
                self.pool.plan(list(need))
                self.planned = need
        return Borrowed(self.pool, self.settings)

    def llms(self):
        return self.pool.llms if self.pool is not None else []

    def close(self):
        if self.pool is not None:
            self.pool.close()
            self.pool = None


class Borrowed:
    """A cell's view of the shared pool: the models' chat_template_kwargs are set on the LLMs it hands out."""

    def __init__(self, pool, settings):
        self.pool, self.settings = pool, settings

    def plan(self, models, shares=None):  # planned once for the sweep
        return self.pool.shares

    def get(self, model=None):
        llm = self.pool.get(model)
        kwargs = self.settings.get(str(model), {}).get("chat_template_kwargs") if model is not None else None
        if kwargs:
            llm.chat_template_kwargs = dict(kwargs)
        return llm

    def __getattr__(self, name):  # check, llms: the pool's own
        return getattr(self.pool, name)

    def __enter__(self):
        from .backends import PLACEMENT
        self._scope = PLACEMENT.set(self.pool.placement) if self.pool.placement is not None else None
        return self

    def __exit__(self, *exc):
        if self._scope is not None:
            from .backends import PLACEMENT
            PLACEMENT.reset(self._scope)


# ---------------------------------------------------------------------------------------- running

def cell_status(path):
    """done when the cell's summary says every instance finished without error; else pending."""
    try:
        summary = json.loads((Path(path) / SUMMARY).read_text())
    except (OSError, ValueError):
        return "pending"
    return "done" if summary.get("complete") and not summary.get("errors") else "pending"


def sweep_json(sweep, states) -> dict:
    cells = []
    for cell in sweep.cells:
        status, error = states[cell.name]
        cells.append({"name": cell.name, "dir": cell.name, "method": cell.method, "params": cell.params,
                      "status": status, **({"error": error} if error else {})})
    return {"name": sweep.name, "paper": sweep.paper, "table": sweep.table, "scale": sweep.scale,
            "config": str(sweep.path), "analysis": sweep.analysis, "cells": cells, "published": sweep.published}


def write_json(path, data):
    tmp = Path(path).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(to_json(data), indent=1) + "\n")
    os.replace(tmp, path)


def _rows(path):
    """Finished lines of a cell's results.jsonl (read-only: the runner may be appending)."""
    try:
        return (Path(path) / RESULTS).read_bytes().count(b"\n")
    except OSError:
        return 0


def _instances(cell):
    """Instances a cell runs, for the progress bar: its limit, a generator's default, a data file's
    records; 1 when unknown (a hub dataset without a limit)."""
    from .tasks import TASKS
    limit = cell.params.get("limit")
    if limit:
        return limit
    if "--data" in cell.argv:
        return _records(cell.argv[cell.argv.index("--data") + 1])
    task = cell.argv[cell.argv.index("--task") + 1] if "--task" in cell.argv else "gen-arith"
    return 100 if task in TASKS or task.startswith("gen-") else 1


@functools.cache
def _records(path):
    from .tasks import read_records
    try:
        return max(1, len(read_records(path)))
    except (OSError, ValueError):
        return 1


class Progress:
    """One bar for the sweep: instances done over all cells, cells done/total, generated tokens/s, ETA.
    A thread polls the current cell's results file and the engines' counters once a second."""

    def __init__(self, sweep, out, states, pool, enabled, skip=()):
        """skip: cells that will not run (they count as no instances)."""
        from tqdm.auto import tqdm
        self.out, self.pool, self.sweep = Path(out), pool, sweep
        self.sizes = {c.name: 0 if c.name in skip else _instances(c) for c in sweep.cells}
        self.base = {c.name: min(_rows(self.out / c.name), self.sizes[c.name]) for c in sweep.cells}
        self.cells_done = sum(s == "done" for s, _ in states.values())
        self.current, self.start, self.tokens0 = None, time.perf_counter(), None
        self.bar = tqdm(total=sum(self.sizes.values()), initial=sum(self.base.values()),
                        desc="sweep", unit="inst", disable=not enabled, dynamic_ncols=True)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True) if enabled else None
        if self.thread:
            self.thread.start()

    def _tokens(self):
        total = 0
        for llm in self.pool.llms():
            try:
                total += int(llm.stats.get("decode_tokens", 0))
            except Exception:  # counters are a nicety
                pass
        return total

    def _poll(self):
        while not self.stop.wait(1.0):
            self.update()

    def update(self):
        done = sum(self.base.values())
        if self.current is not None:
            name = self.current.name
            done += min(_rows(self.out / name), self.sizes[name]) - self.base[name]
        tokens = self._tokens()
        if self.tokens0 is None:
            self.tokens0 = tokens
        rate = (tokens - self.tokens0) / max(time.perf_counter() - self.start, 1e-9)
        self.bar.n = done
        self.bar.set_postfix_str(f"cells {self.cells_done}/{len(self.sweep.cells)}, {rate:.1f} gen tok/s",
                                 refresh=False)
        self.bar.refresh()

    def cell_finished(self, cell, status):
        self.base[cell.name] = min(_rows(self.out / cell.name), self.sizes[cell.name])
        self.cells_done += status == "done"
        self.current = None
        self.update()

    def close(self):
        self.stop.set()
        if self.thread:
            self.thread.join()
        self.bar.close()


def run_cell(cell, flags, path, pool):
    """One cell: `byzantium run <method> ... --out path` with the shared pool, its output to run.log."""
    from .cli import parser
    args = parser().parse_args(cell.argv + flags + ["--out", str(path)])
    args.pool = pool
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "run.log", "a") as log, contextlib.redirect_stdout(log):
        args.func(args)


def run_sweep(sweep, out, flags=("--no-progress",), backend="native", progress=True, factory=None):
    """Run every cell not done yet into OUT/<cell name>/; returns sweep.json's data. factory: the pool
    class (default LLMPool)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    flags = list(flags)
    states = {c.name: (cell_status(out / c.name), None) for c in sweep.cells}
    write_json(out / SWEEP, sweep_json(sweep, states))
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
                write_json(out / SWEEP, sweep_json(sweep, states))
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
            write_json(out / SWEEP, sweep_json(sweep, states))
    finally:
        bar.close()
        pool.close()
        write_json(out / SWEEP, sweep_json(sweep, states))
    counts = {s: sum(v == s for v, _ in states.values()) for s in ("done", "failed", "pending")}
    print(f"{counts['done']} of {len(sweep.cells)} cells done, {counts['failed']} failed"
          + (" (their errors are in sweep.json; rerun to retry)" if counts["failed"] else "")
          + f"; the tables: byzantium report {out}")
    return sweep_json(sweep, states)
