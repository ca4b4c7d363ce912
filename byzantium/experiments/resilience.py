"""Resilience experiments ("On the Resilience of LLM-Based Multi-Agent Collaboration with Faulty Agents")
over many problems, through the runner, and the paper's comparison table.

    from byzantium.backends import LLMPool
    from byzantium.tasks.resilience import load_resilience_task
    tasks = load_resilience_task("gen-code", limit=20)
    with LLMPool("native") as pool:
        summary = run_resilience_experiment("self-collab", "gen-code", tasks, pool.get(), fault="autoinject",
                                            defense="both", out="runs/x")
        report = run_resilience_sweep(["metagpt", "camel", "mad"], "gen-code", tasks, pool.get(),
                                      fault="autoinject", defense="both", out="runs/sweep")

One run = one system, one task, one condition (a fault or none, a defence or none). Its problems run
concurrently (the engine batches them); each finished problem is one line of OUT/results.jsonl: the
transcript of run_system plus its score (score_output). OUT/summary.json holds the configuration, the
score (pass@1, accuracy, BLEU/chrF as the task has them), what the fault and the defences did (messages
injected, AutoInject JSON failures, Inspector verdicts and invalid replies, AutoTransform fallbacks)
and the engine's counters (in a sweep the engine is shared: a run's counters are those of every run so
far). A sweep runs systems x {clean, faulty, defended} in one event loop, so every run's requests
share the engine's batches, into OUT/<system>/<condition>/, and writes OUT/summary.md and
OUT/summary.json: per system and task the clean, faulty and defended scores, the drop and the share of
it the defence recovers, and their means by structure (the paper's main comparison).
"""
import argparse
import asyncio
import json
import time
from pathlib import Path

from ..backends import (BACKENDS, DEFAULT_MODEL, SamplingParams, add_backend_args, check_models,
                        pool_kwargs)
from ..protocols.resilience import (DEFENSES, FAULTS, STRUCTURES, SYSTEMS, build_system, make_defense, make_fault,
                                   run_system)
from ..protocols.resilience.autoinject import ERROR_TYPES
from ..protocols.resilience.structures import PARAMS as AGENT_PARAMS
from ..tasks.resilience import (BUILTIN_TASKS, DATA_FILES, RESILIENCE_TASKS, aggregate, load_resilience_task,
                               score_output)
from ..tasks.sandbox import PROTECTIONS, SandboxUnavailable, check_sandbox
from .rr import engine_stats
from .runner import SUMMARY, check_resume, is_error, read_results, run_async, split_errors, to_json, write_summary

TASKS = RESILIENCE_TASKS + BUILTIN_TASKS
METRICS = {"code": "pass@1", "number": "accuracy", "math": "accuracy", "verdict": "accuracy",
           "translation": "chrF (mean over sentences)"}
PAPER_DROPS = {"hierarchical": 5.5, "flat": 10.5, "linear": 23.7}  # average drop in points, the paper's headline
# Totals of run_system's per-transcript "stats": what the fault and the Inspector did.
MESSAGE_STATS = ("messages", "injected", "inject_selected", "inject_pieces_chosen", "inject_pieces_rewritten",
                 "inject_json_failures", "inspected", "revised", "inspector_invalid", "inspector_no_revision")
# Settings that tell the conditions of one system and task apart; the rest must match to compare runs.
FAULT_KEYS = ("fault", "faulty_role", "pm", "pe", "error_type", "fault_max_tokens")
DEFENSE_KEYS = ("defense", "inspector_max_tokens")


# ------------------------------------------------------------------------------------------ one run

def label(fault="none", defense="none") -> str:
    """A run's directory name: clean, autoinject, autoinject+both, clean+inspector."""
    return ("clean" if fault == "none" else fault) + ("" if defense == "none" else f"+{defense}")


def condition(config) -> str | None:
    """clean, faulty or defended; None for a defence on a clean system (not part of the table)."""
    faulty, defended = config["fault"] != "none", config["defense"] != "none"
    return "defended" if faulty and defended else "faulty" if faulty else None if defended else "clean"


def make_system(name, faulty_role=None, rounds=None):
    """The system; `rounds` applies to the systems that iterate (a linear pipeline runs once)."""
    system = build_system(name, faulty_role)
    if rounds is not None and system.structure != "linear":
        system = build_system(name, faulty_role, rounds)
    return system


def build_fault(fault, pm=1.0, pe=0.2, error_type="semantic", seed=0, max_tokens=None, cache_path=None):
    """make_fault, with a shorter reply limit for the LLM that writes the faults when asked."""
    obj = make_fault(fault, pm, pe, error_type, seed, cache_path=cache_path)
    if obj is not None and max_tokens is not None:
        obj.params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return obj


def build_defense(defense, inspector_max_tokens=None):
    obj = make_defense(defense)
    if obj is not None and obj.inspector is not None and inspector_max_tokens is not None:
        obj.inspector.params = SamplingParams(max_tokens=inspector_max_tokens, temperature=0.0)
    return obj


def settings(system, task_name, problems, fault="none", defense="none", pm=1.0, pe=0.2, error_type="semantic",
             seed=0, max_tokens=None, fault_max_tokens=None, inspector_max_tokens=None, config=None) -> dict:
    """The configuration recorded in summary.json (compared on resume, matched by the report). A setting
    that cannot act is recorded as None (Pm of a clean run), so it never blocks a resume."""
    faulty, inject = fault != "none", fault == "autoinject"
    inspector = defense in ("inspector", "both")
    return dict(system=system.name, structure=system.structure, task=task_name, problems=problems, seed=seed,
                rounds=system.rounds, max_tokens=max_tokens or AGENT_PARAMS.max_tokens,
                fault=fault, faulty_role=system.faulty_role if faulty else None,
                pm=float(pm) if inject else None, pe=float(pe) if inject else None,
                error_type=error_type if inject else None, fault_max_tokens=fault_max_tokens if faulty else None,
                defense=defense, inspector_max_tokens=inspector_max_tokens if inspector else None, **(config or {}))


def summarize(records, llms) -> dict:
    """The score aggregate (as the task measures it), the fault's and defences' counts, engine counters."""
    scores = [r["score"] for r in records]
    kind = scores[0]["kind"] if scores else None
    summary = {"metric": METRICS.get(kind), **aggregate(scores)}
    if kind == "code":
        summary["pass@1"] = summary["score"]
    summary["messages"] = {k: sum(r["stats"].get(k, 0) for r in records) for k in MESSAGE_STATS}
    sources = [r["autotransform"]["source"] for r in records if r.get("autotransform")]
    if sources:
        summary["autotransform"] = {"llm": sources.count("llm"), "fallback": sources.count("fallback")}
    summary["engine"] = engine_stats(llms)
    return summary


async def _run(system, task_name, tasks, llm, fault_obj, defense_obj, config, out, gate, seed, params,
               progress, desc, sandbox_allow_missing=()):
    """One run into OUT (resuming); returns its summary. `gate` bounds the problems in flight over every
    run that shares it. The summary is written even when the run is interrupted (complete: false)."""
    check_resume(out, config)

    async def solve(task):
        async with gate:
            transcript = await run_system(system, task, llm, fault_obj, defense_obj, params, seed)
        # Code runs in a sandbox subprocess and blocks: off the event loop, so the engine keeps stepping.
        score = await asyncio.to_thread(score_output, task, transcript["output"], allow_missing=sandbox_allow_missing)
        return {"task": task_name, "question": task.question, "gold": task.gold, "score": score, **transcript}

    start, complete = time.perf_counter(), False
    try:
        await run_async(tasks, solve, out, key=lambda t: t.id, concurrency=max(1, len(tasks)),
                        stats=lambda: engine_stats([llm]), desc=desc, progress=progress)
        complete = True
    finally:
        wanted = {t.id for t in tasks}
        rows = [r for r in read_results(out) if r["id"] in wanted] if Path(out).exists() else []
        records, failed = split_errors(rows)  # error rows are counted, never scored
        summary = summarize(records, [llm])
        summary.update(config=config, instances=len(records), errors=len(failed), failed=failed, total=len(tasks),
                       complete=complete and len(records) == len(tasks), seconds=time.perf_counter() - start)
        write_summary(out, summary)
    return to_json(summary)


async def run_resilience_async(system, task_name, tasks, llm, fault="none", defense="none", pm=1.0, pe=0.2,
                               error_type="semantic", faulty_role=None, rounds=None, seed=0, max_tokens=None,
                               fault_max_tokens=None, inspector_max_tokens=None, out=None, concurrency=64,
                               config=None, progress=True, sandbox_allow_missing=()) -> dict:
    """run_resilience_experiment inside a running event loop (to gather several runs on one engine)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    sys_obj = make_system(system, faulty_role, rounds)
    out = Path(out or f"runs/resilience/{task_name}/{system}/{label(fault, defense)}")
    fault_obj = build_fault(fault, pm, pe, error_type, seed, fault_max_tokens, out / "autotransform.json")
    recorded = settings(sys_obj, task_name, len(tasks), fault, defense, pm, pe, error_type, seed, max_tokens,
                        fault_max_tokens, inspector_max_tokens, config)
    return await _run(sys_obj, task_name, tasks, llm, fault_obj, build_defense(defense, inspector_max_tokens),
                      recorded, out, asyncio.Semaphore(concurrency), seed, _agent_params(max_tokens), progress,
                      f"{system} {label(fault, defense)}", sandbox_allow_missing)


def run_resilience_experiment(system, task_name, tasks, llm, fault="none", defense="none", pm=1.0, pe=0.2,
                              error_type="semantic", faulty_role=None, rounds=None, seed=0, max_tokens=None,
                              fault_max_tokens=None, inspector_max_tokens=None, out=None, concurrency=64,
                              config=None, progress=True, table=True, sandbox_allow_missing=()) -> dict:
    """Run `system` (a name of SYSTEMS) on every task, resuming from OUT; returns the summary written to
    OUT/summary.json. fault: none | autotransform | autoinject (pm, pe, error_type); defense: none |
    challenger | inspector | both; faulty_role None: the system's default; rounds None: its default.
    max_tokens: the agents' reply limit; fault_max_tokens / inspector_max_tokens: those of the LLM that
    writes the faults and of the Inspector (None: their defaults). seed: the agents' and AutoInject's
    sampling seeds. config: extra settings to record (model, backend, data); a rerun into an OUT written
    with a different configuration is refused. out None: runs/resilience/<task>/<system>/<condition>.
    sandbox_allow_missing: the sandbox protections (sandbox.PROTECTIONS) generated code may run without."""
    summary = asyncio.run(run_resilience_async(system, task_name, tasks, llm, fault, defense, pm, pe, error_type,
                                               faulty_role, rounds, seed, max_tokens, fault_max_tokens,
                                               inspector_max_tokens, out, concurrency, config, progress,
                                               sandbox_allow_missing))
    if table:
        print_summary(summary)
    return summary


def _agent_params(max_tokens):
    return AGENT_PARAMS if max_tokens is None else SamplingParams(max_tokens=max_tokens, temperature=0.0)


def print_summary(summary):
    c, m = summary["config"], summary["messages"]
    score = summary.get("score")
    line = (f"{c['system']} ({c['structure']}) on {c['task']}, {label(c['fault'], c['defense'])}: "
            f"{summary['metric'] or 'score'} {'-' if score is None else f'{100 * score:.1f}'} "
            f"over {summary['instances']}/{summary['total']} problems"
            + (f", {summary['errors']} failed (rerun to retry)" if summary.get("errors") else ""))
    if "bleu" in summary:
        line += f" (corpus BLEU {summary['bleu']:.1f}, chrF {summary['chrf']:.1f})"
    print(line)
    print(f"messages {m['messages']}: {m['injected']} injected ({m['inject_json_failures']} AutoInject JSON failures), "
          f"{m['inspected']} inspected, {m['revised']} revised ({m['inspector_invalid']} invalid Inspector replies)")
    e = summary["engine"]
    print(f"engine: prefill {e['prefill_tokens']}, decode {e['decode_tokens']}, cached {e['cached_tokens']} tokens")


# -------------------------------------------------------------------------------------------- sweep

async def run_resilience_sweep_async(systems, task_name, tasks, llm, fault="autoinject", defense="both",
                                     conditions=None, pm=1.0, pe=0.2, error_type="semantic", faulty_role=None,
                                     rounds=None, seed=0, max_tokens=None, fault_max_tokens=None,
                                     inspector_max_tokens=None, out="runs/resilience", concurrency=64, config=None,
                                     progress=True, sandbox_allow_missing=()) -> dict:
    """Every system under every condition, all in one gather; returns the report (also in OUT/summary.json
    and OUT/summary.md). conditions: (fault, defense) pairs; default clean, (fault, none), (fault, defense)
    (the last left out when defense is none). concurrency bounds the problems in flight over all runs."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if conditions is None:
        if fault == "none":
            raise ValueError("a sweep needs a fault (autotransform or autoinject): without one there is no drop")
        conditions = [("none", "none"), (fault, "none")] + ([(fault, defense)] if defense != "none" else [])
    out = Path(out)
    # One fault object per fault for the whole sweep: the faulty and defended runs of a system then share
    # AutoTransform's rewritten profile (one request, one cache file).
    faults = {f: build_fault(f, pm, pe, error_type, seed, fault_max_tokens, out / "autotransform.json")
              for f in dict.fromkeys(f for f, _ in conditions)}
    gate = asyncio.Semaphore(concurrency)
    runs, dirs = [], []
    for name in systems:
        sys_obj = make_system(name, faulty_role, rounds)
        for f, d in conditions:
            run_dir = out / name / label(f, d)
            recorded = settings(sys_obj, task_name, len(tasks), f, d, pm, pe, error_type, seed, max_tokens,
                                fault_max_tokens, inspector_max_tokens, config)
            check_resume(run_dir, recorded)  # every run checked before any starts
            dirs.append(run_dir)
            runs.append((sys_obj, faults[f], build_defense(d, inspector_max_tokens), recorded, run_dir,
                         f"{name} {label(f, d)}"))
    start = time.perf_counter()
    summaries = await asyncio.gather(*(_run(s, task_name, tasks, llm, fo, do, rec, path, gate, seed,
                                            _agent_params(max_tokens), progress, desc, sandbox_allow_missing)
                                       for s, fo, do, rec, path, desc in runs))
    report = resilience_report(summaries)
    report["runs"] = [str(p.relative_to(out)) for p in dirs]
    report["seconds"] = time.perf_counter() - start
    report["engine"] = engine_stats([llm])  # the engine is shared: these are every run's together
    write_report(out, report)
    return report


def run_resilience_sweep(systems, task_name, tasks, llm, fault="autoinject", defense="both", table=True,
                         **kwargs) -> dict:
    """run_resilience_sweep_async from synchronous code; prints the table."""
    report = asyncio.run(run_resilience_sweep_async(systems, task_name, tasks, llm, fault, defense, **kwargs))
    if table:
        print(format_report(report))
    return report


def write_report(out, report):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_summary(out, report)
    (out / "summary.md").write_text(format_report(report) + "\n")


# ------------------------------------------------------------------------------------------- report

def load_summaries(paths) -> list:
    """Run summaries from summary dicts, run directories, summary.json files, or directories above runs
    (a sweep's OUT: every run summary found below it)."""
    summaries = []
    for item in paths:
        if isinstance(item, dict):
            summaries.append(item)
            continue
        path = Path(item)
        files = [path] if path.is_file() else [path / SUMMARY] if _is_run(path / SUMMARY) else \
            sorted(p for p in path.rglob(SUMMARY) if _is_run(p))
        if not files:
            raise ValueError(f"{path}: no resilience run summary there")
        summaries += [json.loads(p.read_text()) for p in files]
    return summaries


def _is_run(path) -> bool:
    if not path.is_file():
        return False
    config = json.loads(path.read_text()).get("config")
    return isinstance(config, dict) and "system" in config and "fault" in config


def _points(summary):
    return None if summary is None or summary.get("score") is None else 100 * summary["score"]


def _key(config, keys):
    return json.dumps({k: config.get(k) for k in keys}, sort_keys=True)


def resilience_report(runs) -> dict:
    """The table from run summaries (see load_summaries for what `runs` may be). Scores are in points
    (100 x the task's score). One row per system, task, fault and defence:
        drop      = clean - faulty
        recovered = (defended - faulty) / (clean - faulty), None when the drop is 0 (undefined)
    Runs are compared only when every other setting (model, problems, seed, rounds, ...) matches. By
    structure: the means of the rows' numbers per (structure, fault, defence), and the recovered share
    of the mean drop."""
    summaries = load_summaries(runs)
    groups, skipped = {}, []
    for s in summaries:
        c = s["config"]
        cond = condition(c)
        if cond is None:
            skipped.append(f"{c['system']} {label(c['fault'], c['defense'])}: a defence without a fault")
            continue
        base = _key(c, [k for k in c if k not in FAULT_KEYS + DEFENSE_KEYS])
        group = groups.setdefault(base, {"clean": None, "faulty": {}, "defended": {}})
        if cond == "clean":
            group["clean"] = s
        elif cond == "faulty":
            group["faulty"][_key(c, FAULT_KEYS)] = s
        else:
            group["defended"].setdefault(_key(c, FAULT_KEYS), {})[_key(c, DEFENSE_KEYS)] = s

    rows = []
    for group in groups.values():
        faults = list(dict.fromkeys(list(group["faulty"]) + list(group["defended"]))) or [None]
        for fk in faults:
            defended = list(group["defended"].get(fk, {}).values()) or [None]
            for d in defended:
                rows.append(_row(group["clean"], group["faulty"].get(fk), d))
    order = {name: i for i, name in enumerate(SYSTEMS)}
    rows.sort(key=lambda r: (r["task"], STRUCTURES.index(r["structure"]), order.get(r["system"], 99),
                             r["fault"] or "", r["defense"] or ""))
    return {"rows": rows, "structures": _by_structure(rows), "skipped": skipped, "paper_drops": PAPER_DROPS}


def _row(clean, faulty, defended) -> dict:
    some = clean or faulty or defended
    c = some["config"]
    fc = (faulty or defended or {}).get("config", {})
    row = {"system": c["system"], "structure": c["structure"], "task": c["task"], "model": c.get("model"),
           "metric": some.get("metric"),
           "fault": fc.get("fault"), "fault_settings": {k: fc.get(k) for k in FAULT_KEYS} if fc else None,
           "defense": defended["config"]["defense"] if defended else None,
           "clean": _points(clean), "faulty": _points(faulty), "defended": _points(defended),
           "complete": all(s["complete"] for s in (clean, faulty, defended) if s is not None)}
    row["drop"], row["recovered"], row["note"] = _drop_and_share(row["clean"], row["faulty"], row["defended"])
    return row


def _drop_and_share(clean, faulty, defended):
    """(drop, recovered share, note); the share is undefined (None) when there is no drop to recover."""
    if clean is None or faulty is None:
        return None, None, None
    drop = clean - faulty
    if defended is None:
        return drop, None, None
    if drop == 0:
        return drop, None, "no drop: recovered share undefined"
    return drop, (defended - faulty) / drop, None


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _by_structure(rows) -> list:
    groups = {}
    for r in rows:
        groups.setdefault((r["task"], r["structure"], r["fault"], r["defense"]), []).append(r)
    out = []
    for (task, structure, fault, defense), rs in groups.items():
        mean = {k: _mean(r[k] for r in rs) for k in ("clean", "faulty", "defended", "drop")}
        full = [r for r in rs if None not in (r["clean"], r["faulty"], r["defended"])]
        # The share of the mean drop recovered on average (not a mean of shares: one tiny drop would
        # dominate it); over the rows that have all three numbers.
        drop = _mean(r["drop"] for r in full)
        share, note = None, None
        if full:
            if drop == 0:
                note = "no drop: recovered share undefined"
            else:
                share = (_mean(r["defended"] for r in full) - _mean(r["faulty"] for r in full)) / drop
        out.append({"task": task, "structure": structure, "fault": fault, "defense": defense,
                    "systems": sorted({r["system"] for r in rs}), **mean, "recovered": share, "note": note,
                    "paper_drop": PAPER_DROPS.get(structure)})
    return out


def _num(x, signed=False):
    return "-" if x is None else f"{x:+.1f}" if signed else f"{x:.1f}"


def _share(x, note):
    return "n/a (no drop)" if note else "-" if x is None else f"{100 * x:.0f}%"


def _table(header, rows) -> list:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def format_report(report) -> str:
    """The report as markdown: the per-run table, then the means by structure."""
    rows = report["rows"]
    if not rows:
        return "no runs to report"
    lines = ["Scores in points (pass@1 or accuracy in %, or sentence chrF); drop = clean - faulty; "
             "recovered = (defended - faulty) / (clean - faulty).", ""]
    lines += _table(["system", "structure", "task", "fault", "defence", "clean", "faulty", "defended", "drop",
                     "recovered"],
                    [[r["system"] + ("" if r["complete"] else " *"), r["structure"], r["task"], r["fault"] or "-",
                      r["defense"] or "-", _num(r["clean"]), _num(r["faulty"]), _num(r["defended"]),
                      _num(r["drop"], True), _share(r["recovered"], r["note"])] for r in rows])
    if not all(r["complete"] for r in rows):
        lines.append("\n\\* a run of this row has not finished every problem")
    paper = ", ".join(f"{k} {v}" for k, v in PAPER_DROPS.items())
    lines += ["", f"Means by structure (paper, average drop in points: {paper}):", ""]
    lines += _table(["structure", "task", "fault", "defence", "systems", "clean", "faulty", "defended", "drop",
                     "recovered", "paper drop"],
                    [[s["structure"], s["task"], s["fault"] or "-", s["defense"] or "-", str(len(s["systems"])),
                      _num(s["clean"]), _num(s["faulty"]), _num(s["defended"]), _num(s["drop"], True),
                      _share(s["recovered"], s["note"]), _num(s["paper_drop"])] for s in report["structures"]])
    if report.get("skipped"):
        lines += ["", "Not in the table: " + "; ".join(report["skipped"])]
    return "\n".join(lines)


def print_report(runs):
    """Print the table for run directories, sweep directories or summaries."""
    print(format_report(resilience_report(runs)))


# ---------------------------------------------------------------------------------------------- CLI

def add_resilience_args(ap):
    """The flags of `byzantium run resilience` (defaults: the paper's Pm 1.0, Pe 0.2, semantic errors)."""
    ap.add_argument("--system", choices=list(SYSTEMS) + ["all"], default="self-collab",
                    help="the system (default self-collab); all: every one, into OUT/<system>/<condition>")
    ap.add_argument("--task", choices=TASKS, default="gen-code",
                    help="humaneval, ciar, commonmt, faireval (with --data), or the built-in gen-code (default) "
                         "or gen-arith")
    ap.add_argument("--data", default=None, help="the task's data file, or the directory holding it under its "
                    "usual name (" + ", ".join(DATA_FILES.values()) + ")")
    ap.add_argument("--fault", choices=FAULTS, default="none", help="the fault of the faulty role (default none)")
    ap.add_argument("--pm", type=float, default=1.0, help="AutoInject: share of messages corrupted (default 1.0)")
    ap.add_argument("--pe", type=float, default=0.2,
                    help="AutoInject: share of lines or sentences of a message corrupted (default 0.2)")
    ap.add_argument("--error-type", choices=ERROR_TYPES, default="semantic",
                    help="AutoInject's errors (default semantic)")
    defaults = ", ".join(f"{name} {build_system(name).faulty_role}" for name in SYSTEMS)
    ap.add_argument("--faulty-role", default=None,
                    help=f"the faulty role (default: the system's, as in the paper: {defaults})")
    ap.add_argument("--defense", choices=DEFENSES, default="none", help="the defence (default none)")
    ap.add_argument("--sweep", action="store_true",
                    help="run clean, faulty (--fault) and defended (--fault with --defense) together and print "
                         "the drop and the share a defence recovers")
    ap.add_argument("--model", default=None, help="every agent's model (default smollm2-135m)")
    add_backend_args(ap)
    ap.add_argument("--limit", type=int, default=None, help="number of problems (built-in tasks: default 100)")
    ap.add_argument("--seed", type=int, default=0,
                    help="problem selection and generation, agents' and AutoInject's sampling seeds (default 0)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="exchanges of camel, spp, mad, agentverse (default: each system's); linear ones run once")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help=f"new tokens per agent turn (default {AGENT_PARAMS.max_tokens})")
    ap.add_argument("--fault-max-tokens", type=int, default=None,
                    help="new tokens per AutoInject or AutoTransform request (default: theirs, 2048 / 1024)")
    ap.add_argument("--inspector-max-tokens", type=int, default=None,
                    help="new tokens per Inspector review (default 1536)")
    ap.add_argument("--out", default=None, help="output directory (default runs/resilience/<task>/..., one "
                    "subdirectory per system and condition)")
    ap.add_argument("--concurrency", type=int, default=64,
                    help="problems in flight at once, over all runs (default 64)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--sandbox-allow-missing", action="append", choices=PROTECTIONS, default=None, metavar="NAME",
                    help="run generated code without this sandbox protection where the machine cannot set it up "
                         f"({', '.join(PROTECTIONS)}; repeatable); by default such a run is refused")


def _choose(flag, value, choices):
    if value not in choices:
        raise ValueError(f"unknown --{flag} {value!r}; choose one of {', '.join(choices)}")


def prepare_resilience(args):
    """Check every argument and load the problems; loads no model. Returns (system names, problems,
    conditions, OUT, {(system, fault, defense): run directory}, whether OUT holds several runs). Bad
    settings raise ValueError naming the flag (and the choices)."""
    _choose("system", args.system, list(SYSTEMS) + ["all"])
    _choose("task", args.task, TASKS)
    _choose("fault", args.fault, FAULTS)
    _choose("defense", args.defense, DEFENSES)
    _choose("error-type", args.error_type, ERROR_TYPES)
    _choose("backend", args.backend, BACKENDS)
    for flag in ("pm", "pe"):
        value = getattr(args, flag)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"--{flag} must be a probability in [0, 1], got {value}")
    for flag in ("limit", "rounds", "max_tokens", "fault_max_tokens", "inspector_max_tokens", "concurrency"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.sweep and args.fault == "none":
        raise ValueError("--sweep compares clean, faulty and defended runs: give --fault autotransform or autoinject")
    systems = list(SYSTEMS) if args.system == "all" else [args.system]
    for name in systems:  # an unknown --faulty-role is refused here, naming the system's roles
        make_system(name, args.faulty_role, args.rounds)

    if args.task in BUILTIN_TASKS:
        if args.data is not None:
            raise ValueError(f"--task {args.task} is built in and reads no file; drop --data {args.data}")
    elif args.data is None:
        raise ValueError(f"--task {args.task} needs its data: --data {DATA_FILES[args.task]} (or its directory)")
    elif not Path(args.data).exists():
        raise ValueError(f"--data {args.data!r}: no such file or directory")
    try:
        tasks = load_resilience_task(args.task, args.data, limit=args.limit, seed=args.seed)
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None
    if not tasks:
        raise ValueError("no problems to run")

    if any(t.kind == "code" for t in tasks):  # generated code will run: the sandbox must be there
        try:
            check_sandbox(tuple(getattr(args, "sandbox_allow_missing", None) or ()))
        except SandboxUnavailable as error:
            raise ValueError(f"--task {args.task} runs generated code, and {error}. Name a protection to go "
                             f"without with --sandbox-allow-missing {{{','.join(PROTECTIONS)}}}") from None
    check_models(args, [args.model])  # local resolution, or the server's model list (--backend openai)

    if args.sweep:
        conditions = [("none", "none"), (args.fault, "none")] + \
                     ([(args.fault, args.defense)] if args.defense != "none" else [])
    else:
        conditions = [(args.fault, args.defense)]
    many = args.sweep or len(systems) > 1
    if args.out is not None:
        out = Path(args.out)
    else:
        out = Path("runs/resilience") / args.task
        if not many:
            out = out / systems[0] / label(args.fault, args.defense)
    run_dirs = {(name, f, d): out / name / label(f, d) if many else out for name in systems for f, d in conditions}
    return systems, tasks, conditions, out, run_dirs, many


def _config(args):
    return dict(model=args.model or DEFAULT_MODEL, backend=args.backend, data=args.data)


def _all_done(run_dirs, tasks) -> bool:
    for path in run_dirs.values():
        done = {r["id"] for r in read_results(path) if not is_error(r)} if Path(path).is_dir() else set()
        if not (all(t.id in done for t in tasks) and (Path(path) / SUMMARY).is_file()):
            return False
    return True


def cmd_resilience(args):
    """`byzantium run resilience ...`: checks everything, then runs (one system, every system, or the
    clean/faulty/defended sweep) and prints the table."""
    systems, tasks, conditions, out, run_dirs, many = prepare_resilience(args)
    config = _config(args)
    kwargs = dict(pm=args.pm, pe=args.pe, error_type=args.error_type, faulty_role=args.faulty_role,
                  rounds=args.rounds, seed=args.seed, max_tokens=args.max_tokens,
                  fault_max_tokens=args.fault_max_tokens, inspector_max_tokens=args.inspector_max_tokens,
                  sandbox_allow_missing=tuple(getattr(args, "sandbox_allow_missing", None) or ()))
    for (name, f, d), path in run_dirs.items():  # a rerun with other settings is refused before any model loads
        check_resume(path, settings(make_system(name, args.faulty_role, args.rounds), args.task, len(tasks), f, d,
                                    args.pm, args.pe, args.error_type, args.seed, args.max_tokens,
                                    args.fault_max_tokens, args.inspector_max_tokens, config))
    if _all_done(run_dirs, tasks):
        print(f"all {len(tasks)} problems of every run already done in {out}; nothing to run")
        if many:
            write_report(out, {**resilience_report(list(run_dirs.values())), "runs": [
                str(p.relative_to(out)) for p in run_dirs.values()]})
        _print_done(out, run_dirs, many)
        return

    from ..backends import LLMPool
    # `byzantium profile` hands in its own pool
    with getattr(args, "pool", LLMPool)(args.backend, **pool_kwargs(args)) as pool:
        llm = pool.get(args.model)
        common = dict(concurrency=args.concurrency, config=config, progress=not args.no_progress, **kwargs)
        if many:
            run_resilience_sweep(systems, args.task, tasks, llm, args.fault, args.defense, conditions=conditions,
                                 out=out, **common)
        else:
            (f, d), = conditions
            run_resilience_experiment(systems[0], args.task, tasks, llm, f, d, out=out, **common)
    print(f"results in {out}" + ("/<system>/<condition>/results.jsonl, table in " + str(out / "summary.md")
                                 if many else "/results.jsonl, summary in " + str(out / SUMMARY)))


def _print_done(out, run_dirs, many):
    if many:
        print((Path(out) / "summary.md").read_text().rstrip())
    else:
        print_summary(json.loads((Path(out) / SUMMARY).read_text()))


def parser():
    """A stand-alone parser with just these flags (the CLI adds them to its `run resilience`)."""
    ap = argparse.ArgumentParser(prog="byzantium run resilience")
    add_resilience_args(ap)
    return ap


__all__ = ["TASKS", "METRICS", "PAPER_DROPS", "label", "condition", "make_system", "build_fault",
           "build_defense", "settings", "summarize", "run_resilience_async", "run_resilience_experiment",
           "print_summary", "run_resilience_sweep_async", "run_resilience_sweep", "write_report", "load_summaries",
           "resilience_report", "format_report", "print_report", "add_resilience_args", "prepare_resilience",
           "cmd_resilience", "parser"]
