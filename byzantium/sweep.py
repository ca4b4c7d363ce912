"""`byzantium sweep FILE.toml --out DIR`: every cell of an experiment file (sweep_config.py), each an
ordinary `byzantium run <method>` into DIR/<cell name>/, one engine per model for the whole sweep.

    byzantium sweep ct_table1 --out runs/ct1                      # a shipped file by name; smoke scale
    byzantium sweep my.toml --out runs/x --scale paper --data-root ~/data --dry-run   # what it needs
    byzantium sweep ct_table1 --out runs/ct1-try --scale paper --data-root ~/data --limit 5   # 5 problems a cell

Cells run one after another (each runs up to its --concurrency instances at once, which the engine
batches). A rerun with the same DIR skips what is done (the runner's resume rules, per cell). A cell
that fails (a model not on this machine, a bad data file, a context too short) is marked failed in
DIR/sweep.json with its message, and the sweep goes on; Ctrl-C stops it, and a rerun resumes.

--limit N overrides every cell's limit (the file is not copied); it is recorded in sweep.json, and a
rerun into the same DIR with another --limit (or none) is refused: its cells would count as done with
the other number of problems. --dry-run prints what each cell needs: problems, generated tokens (an
upper bound), the weights against the device's memory and the hours at a rate measured in
bench/results/ (none is invented: "no measured rate" otherwise). It reads nothing from the network.

DIR/sweep.json (written at the start, after each cell and at the end) is what `byzantium report` reads:
    {"name", "paper", "table", "scale", "config", "limit", "analysis": {...},
     "cells": [{"name", "dir", "method", "params": {...}, "status": "pending"|"done"|"failed", "error"}],
     "published": [{"table", "method", "metric", "value", ["value_max", "unit"], "where": {...}, "source"}]}
"""
import contextlib
import functools
import json
import os
import re
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
                    help="list the cells, their models, which backend would serve them, the context, problems, "
                         "generated tokens, weights and hours they need; loads nothing")
    ap.add_argument("--limit", type=int, default=None, metavar="N",
                    help="N problems a cell, whatever the file says (recorded in DIR/sweep.json: a rerun into "
                         "the same DIR must give the same --limit)")
    ap.add_argument("--device-memory", type=float, default=None, metavar="GB",
                    help=f"the device memory the dry run fits the weights into (default: this machine's GPU "
                         f"by torch.cuda, else {DEVICE_MEMORY_GB:g}, one H200)")
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
    apply_limit(sweep, args.limit)
    if args.device_memory is not None and args.device_memory <= 0:
        raise ValueError(f"--device-memory must be > 0 GB, got {args.device_memory:g}")
    dtype = check_dtype(args.dtype, args.device)
    from .backends import pool_kwargs
    pool_kwargs(args)  # the backend flags' own checks (--backend openai needs --base-url, ...)
    flags = run_flags(args)
    for cell in sweep.cells:  # each cell with them, before anything loads
        parse_cell(cell, sweep.path.name, flags)
    if args.dry_run:
        print(describe(sweep, args.backend, dtype, device_memory(args.device_memory)))
        return
    result = run_sweep(sweep, args.out, flags, backend=args.backend, progress=not args.no_progress,
                       limit=args.limit)
    return 1 if any(cell["status"] == "failed" for cell in result["cells"]) else 0  # scripts see failed cells


# ---------------------------------------------------------------------------------------- --limit

def apply_limit(sweep, limit):
    """--limit N: every cell's limit becomes N (argv and params, so that sweep.json and the report show it)."""
    if limit is None:
        return
    if limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    for cell in sweep.cells:
        where = cell.sources.get("limit", "")
        if "axes" in where or "cells" in where:  # N for all would make those cells one run under several names
            raise ValueError(f"{sweep.path.name}: {where}.limit varies limit across cells; --limit would make "
                             "them the same run: drop --limit or edit the file")
        if "--limit" in cell.argv:
            cell.argv[cell.argv.index("--limit") + 1] = str(limit)
        else:
            cell.argv += ["--limit", str(limit)]
        cell.params["limit"] = limit
        cell.sources["limit"] = "--limit"


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


# ---------------------------------------------------------------------------------------- the dry run

DEVICE_MEMORY_GB = 141  # one H200 (141 GB of HBM3e), when there is no GPU here to ask
WEIGHTS_SHARE = 0.8  # the weights must leave a fifth of the device for the KV cache and activations
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2}
# Mixture-of-experts names give the active parameters and the experts, not the total the device holds:
# the totals from the model cards. Any other xB-yE name is "unknown" rather than a guess.
MOE_TOTAL = {"17B-16E": 109e9, "17B-128E": 400e9, "8x7B": 46.7e9, "8x22B": 141e9}
BENCH = Path(__file__).resolve().parents[1] / "bench" / "results"  # measured throughput (a source checkout)


def check_dtype(dtype, device):
    """The dtype the weights are sized in: --dtype, else the engine's default (bfloat16 on a GPU,
    float32 with --device cpu)."""
    dtype = (dtype or ("float32" if device == "cpu" else "bfloat16")).lower()
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown --dtype {dtype!r}; choose float32, float16 or bfloat16")
    return dtype


def device_memory(flag_gb=None):
    """(bytes, where the number comes from): --device-memory when given (planning for another machine),
    else this machine's first GPU, else one H200."""
    if flag_gb is not None:
        return flag_gb * 1e9, "--device-memory"
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory, torch.cuda.get_device_name(0)
    except Exception:  # no usable torch.cuda: the default below
        pass
    return DEVICE_MEMORY_GB * 1e9, "default: one H200"


def _arg(cell, flag):
    return cell.argv[cell.argv.index(flag) + 1] if flag in cell.argv else None


def cell_problems(cell):
    """Problems a cell runs: a data file's records cut by sample and limit; a generator's limit (default
    100); a hub dataset's limit or sample; None when unknown (a hub dataset without either, an unreadable file)."""
    from .tasks import TASKS
    from .tasks.resilience import BUILTIN_TASKS
    limit, sample = cell.params.get("limit"), cell.params.get("sample")
    caps = [n for n in (sample, limit) if n]
    data = _arg(cell, "--data")
    if data is not None:
        n = _records(data)
        return None if n is None else min([n] + caps)
    task = _arg(cell, "--task") or ("gen-code" if cell.method == "resilience" else "gen-arith")
    if task in TASKS or task in BUILTIN_TASKS or task.startswith("gen-"):
        return limit or 100
    return min(caps) if caps else None


@functools.cache
def _records(path):
    from .tasks import read_records
    try:
        return len(read_records(path))
    except (OSError, ValueError):
        return None


def cell_tokens(cell):
    """Generated tokens per problem, an upper bound (every answer runs to its length limit): MAJ N x L,
    RR L (one shared answer), RRMaj M x L; SAC n solves and self-scores, then T rounds of a refine and a
    judgement of each neighbour and itself per agent (CP-WBFT: no judge, and logprob scoring generates
    none); resilience: its agents' turns x max_tokens (the fault writer's and inspector's calls not counted)."""
    p = cell.params
    if cell.method in ("maj", "rr", "rrmaj"):
        answers = {"maj": p.get("agents", 5), "rr": 1, "rrmaj": p.get("trajectories") or p.get("agents", 5)}
        return answers[cell.method] * p.get("max_len", 512)
    if cell.method in ("sac", "cpwbft"):
        n, rounds, solve = p.get("agents", 7), p.get("rounds", 6), p.get("max_tokens") or 1000
        judge = p.get("judge_max_tokens", 1000) if cell.method == "sac" and p.get("score_mode") == "generate" else 0
        try:
            from .experiments.sac import check_config
            graph = check_config(cell.method, n, p.get("weak", 2), p.get("byzantine", 1), p.get("adversary"),
                                 p.get("F", 3), rounds, p.get("topology") or "merg", p.get("seed", 0))
            neighbours = sum(graph.degree(i) for i in graph.nodes)
        except Exception:  # a graph that cannot be built here: every agent judges every other one
            neighbours = n * (n - 1)
        return n * (solve + judge) + rounds * (n * (solve + judge) + neighbours * judge)
    from .experiments.resilience import AGENT_PARAMS, make_system
    system = make_system(p.get("system"), p.get("faulty_role"), p.get("rounds"))
    return sum(len(step) for step in system.steps) * (p.get("max_tokens") or AGENT_PARAMS.max_tokens)


def model_params(name):
    """(parameters, where the number comes from), or (None, why unknown): a local checkpoint's
    safetensors headers, else the count in the name (70B, 135M; mixture-of-experts: the total)."""
    where = local_model(name)
    if where in ("path", "hub cache"):
        try:
            from .engine.memory import checkpoint_params
            if where == "hub cache":  # the snapshot as it is in the cache: no hub call
                from huggingface_hub import try_to_load_from_cache
                folder = Path(try_to_load_from_cache(str(name), "config.json")).parent
            else:
                folder = Path(name).expanduser()
            count = checkpoint_params(folder) if folder.is_dir() else 0
            if count:
                return count, "its checkpoint"
        except Exception:  # an unreadable checkpoint: the name below
            pass
    base = short_model(name) if name is not None else "smollm2-135m"
    moe = re.search(r"(?:^|[-_])(\d+B-\d+E|\d+x\d+B)(?=$|[-_])", base, re.I)
    if moe:
        key = moe[1].upper().replace("X", "x")
        return (MOE_TOTAL[key], "its name (MoE total)") if key in MOE_TOTAL else (None, f"MoE {key}: total unknown")
    count = re.search(r"(?:^|[-_])(\d+(?:\.\d+)?)([BM])(?=$|[-_])", base, re.I)
    if count:
        return float(count[1]) * (1e9 if count[2].upper() == "B" else 1e6), "its name"
    return None, "no parameter count in its name"


@functools.cache
def measured_rates():
    """{model (lower case): (generated tok/s, device, file, batch)} from bench/results/*.json: the engine's
    decode rate at the largest batch measured (a sweep decodes many sequences at once); a GPU measurement
    wins over a CPU one. Empty outside a source checkout."""
    rates = {}
    for path in sorted(BENCH.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for run in data if isinstance(data, list) else [data]:
            if not isinstance(run, dict) or not isinstance(run.get("model"), str):
                continue
            rows = [r for r in run.get("rows") or [] if isinstance(r, dict)
                    and isinstance(r.get("byzantium"), dict) and r["byzantium"].get("decode_tok_s")]
            key, device = run["model"].lower(), str(run.get("device", "?"))
            if not rows or (key in rates and rates[key][1] == "cuda" and device != "cuda"):
                continue
            best = max(rows, key=lambda r: r.get("batch", 0))
            rates[key] = (float(best["byzantium"]["decode_tok_s"]), device, path.name, best.get("batch"))
    return rates


def measured_rate(name):
    return measured_rates().get((short_model(name) if name is not None else "smollm2-135m").lower())


def _si(n):
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def _hours(h):
    return f"{h:.1f} h" if h >= 0.1 else f"{h * 60:.1f} min" if h * 60 >= 0.1 else f"{h * 3600:.1f} s"


def estimate(sweep, cell, backend, dtype, budget):
    """A cell's dry-run numbers: {problems, tokens, weights (bytes), fits, hours, device}; None for unknown."""
    problems = cell_problems(cell)
    tokens = None if problems is None else problems * cell_tokens(cell)
    if backend == "openai":  # served elsewhere: no weights here, and the server's speed is not measured
        return dict(problems=problems, tokens=tokens, weights=None, fits=None, hours=None, device=None)
    sizes = [model_params(m)[0] for m in cell.models]
    weights = None if None in sizes else sum(sizes) * DTYPE_BYTES[dtype]
    rates = [measured_rate(m) for m in cell.models]
    known = tokens is not None and None not in rates
    slowest = min(rates, key=lambda r: r[0]) if known else None  # several models: the slowest bounds it
    return dict(problems=problems, tokens=tokens, weights=weights,
                fits=None if weights is None else weights <= budget,
                hours=tokens / slowest[0] / 3600 if known else None, device=slowest[1] if known else None)


def describe(sweep, backend="native", dtype="bfloat16", memory=None) -> str:
    """The dry run's listing: per cell its method, problems, generated tokens, context, weights against
    the device and hours; per model who serves it, its context and size; the totals."""
    memory, memory_from = memory or device_memory()
    budget = WEIGHTS_SHARE * memory
    lines = [f"{sweep.path.name}: {sweep.paper} {sweep.table}, scale {sweep.scale}: {len(sweep.cells)} cells",
             f"{'cell':<48} {'method':<10} {'problems':>8} {'gen tokens':>10} {'needs len':>9} "
             f"{'weights':>9} {'fits':<5} {'hours':<18} models"]
    totals = []
    for cell in sweep.cells:
        e = estimate(sweep, cell, backend, dtype, budget)
        totals.append(e)
        models = ", ".join(short_model(m) for m in cell.models)
        problem = cell_problem(sweep, cell, backend)
        served = backend == "openai"
        hours = "served" if served else (
            f"{_hours(e['hours'])} ({e['device']})" if e["hours"] is not None else "no measured rate")
        weights = "-" if served else f"{e['weights'] / 1e9:.1f} GB" if e["weights"] is not None else "unknown"
        fits = "-" if served else {True: "yes", False: "NO", None: "?"}[e["fits"]]
        tokens = _si(e["tokens"]) if e["tokens"] is not None else "unknown"
        lines.append(f"{cell.name:<48} {cell.method:<10} {e['problems'] or 'unknown':>8} {tokens:>10} "
                     f"{needed_len(cell, sweep.prompt_budget):>9} {weights:>9} {fits:<5} {hours:<18} {models}"
                     + ("  [cannot run here: see its model below]" if problem and problem.startswith("model ")
                        else f"  [{problem}]" if problem else "") + hub_note(cell))
    lines.append("models:")
    for name in dict.fromkeys(m for cell in sweep.cells for m in cell.models):
        how = serving(name, backend)
        need = max(needed_len(c, sweep.prompt_budget) for c in sweep.cells if name in c.models)
        context = model_context(name, sweep.models)
        kwargs = sweep.models.get(str(name), {}).get("chat_template_kwargs")
        size = ""
        if backend != "openai":
            count, source = model_params(name)
            size = (f"; weights unknown ({source})" if count is None else
                    f"; weights {count * DTYPE_BYTES[dtype] / 1e9:.1f} GB ({_si(count)} parameters from {source}, "
                    f"{dtype})")
            rate = measured_rate(name)
            size += (f"; {rate[0]:.0f} generated tok/s measured on {rate[1]} (bench/results/{rate[2]}, "
                     f"batch {rate[3]})" if rate else "; no measured rate")
        lines.append(f"  {name or 'smollm2-135m (embedded)'}: {how}; max_model_len needed {need}"
                     + (f" (context {context})" if context else "") + size
                     + (f"; chat_template_kwargs {json.dumps(kwargs)}" if kwargs else ""))
    problems = [e["problems"] for e in totals if e["problems"] is not None]
    tokens = [e["tokens"] for e in totals if e["tokens"] is not None]
    hours = [e["hours"] for e in totals if e["hours"] is not None]
    unsized, unrated = len(totals) - len(problems), len(totals) - len(hours)
    lines.append(f"total: {sum(problems)} problems, {_si(sum(tokens))} generated tokens"
                 + (f" ({unsized} cells of unknown size not counted)" if unsized else "")
                 + ("" if backend == "openai" else
                    "; no measured rate for any cell" if not hours else
                    f"; {_hours(sum(hours))} at measured rates"
                    + (f" ({unrated} cells with no measured rate not counted)" if unrated else "")))
    if backend != "openai":
        lines.append(f"fits: the weights of a cell's models within {WEIGHTS_SHARE:.0%} of {memory / 1e9:.0f} GB "
                     f"({memory_from}; --device-memory GB to plan for another), the rest left for the KV cache")
    lines.append("gen tokens: an upper bound, every answer at its length limit (sweep.cell_tokens); needed "
                 f"length = prompt budget ({sweep.prompt_budget} tokens, an estimate) + what the cell generates "
                 "after it (sweep_config.needed_len)")
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


def sweep_json(sweep, states, limit=None) -> dict:
    cells = []
    for cell in sweep.cells:
        status, error = states[cell.name]
        cells.append({"name": cell.name, "dir": cell.name, "method": cell.method, "params": cell.params,
                      "status": status, **({"error": error} if error else {})})
    return {"name": sweep.name, "paper": sweep.paper, "table": sweep.table, "scale": sweep.scale,
            "config": str(sweep.path), "limit": limit, "analysis": sweep.analysis, "cells": cells, "published": sweep.published}


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
    """Instances a cell runs, for the progress bar; 1 when unknown (a hub dataset without a limit)."""
    return cell_problems(cell) or 1


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
