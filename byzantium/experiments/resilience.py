"""Resilience experiments ("On the Resilience of LLM-Based Multi-Agent Collaboration with Faulty Agents")
over many problems, through the runner. The paper's comparison table is resilience_table.py, the
command `byzantium run resilience` resilience_command.py.

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
import asyncio
import time
from dataclasses import replace
from pathlib import Path

from ..backends import SamplingParams
from ..protocols.metrics.diagnostics import cell_diagnostics
from ..protocols.resilience import build_system, make_defense, make_fault, run_system
from ..protocols.resilience.inspector import DECISION_SCHEMA
from ..protocols.resilience.structures import PARAMS as AGENT_PARAMS
from ..tasks.resilience import BUILTIN_TASKS, RESILIENCE_TASKS, aggregate, score_output
from .resilience_table import format_report, label, resilience_report
from .rr import engine_stats
from .runner import build_wait_seconds, check_resume, read_results, run_async, split_errors, to_json, write_summary

TASKS = RESILIENCE_TASKS + BUILTIN_TASKS
METRICS = {"code": "pass@1", "number": "accuracy", "math": "accuracy", "verdict": "accuracy",
           "translation": "chrF (mean over sentences)"}
# Totals of run_system's per-transcript "stats": what the fault and the Inspector did.
MESSAGE_STATS = ("messages", "injected", "inject_selected", "inject_pieces_chosen", "inject_pieces_rewritten",
                 "inject_json_failures", "inspected", "revised", "inspector_invalid", "inspector_no_revision")


# ------------------------------------------------------------------------------------------ one run

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


def build_defense(defense, inspector_max_tokens=None, inspector_json=False):
    """make_defense, with the Inspector's reply limit, and its reply held to its JSON decision when
    inspector_json (a grammar, inspector.DECISION_SCHEMA; off by default, as in the paper)."""
    obj = make_defense(defense)
    if obj is not None and obj.inspector is not None:
        if inspector_max_tokens is not None:
            obj.inspector.params = SamplingParams(max_tokens=inspector_max_tokens, temperature=0.0)
        if inspector_json:
            obj.inspector.params = replace(obj.inspector.params, json_schema=DECISION_SCHEMA)
    return obj


def settings(system, task_name, problems, fault="none", defense="none", pm=1.0, pe=0.2, error_type="semantic",
             seed=0, max_tokens=None, fault_max_tokens=None, inspector_max_tokens=None, config=None,
             inspector_json=False) -> dict:
    """The configuration recorded in summary.json (compared on resume, matched by the report). A setting
    that cannot act is recorded as None (Pm of a clean run), so it never blocks a resume."""
    faulty, inject = fault != "none", fault == "autoinject"
    inspector = defense in ("inspector", "both")
    return dict(system=system.name, structure=system.structure, task=task_name, problems=problems, seed=seed,
                rounds=system.rounds, max_tokens=max_tokens or AGENT_PARAMS.max_tokens,
                fault=fault, faulty_role=system.faulty_role if faulty else None,
                pm=float(pm) if inject else None, pe=float(pe) if inject else None,
                error_type=error_type if inject else None, fault_max_tokens=fault_max_tokens if faulty else None,
                defense=defense, inspector_max_tokens=inspector_max_tokens if inspector else None,
                **({"inspector_json": True} if inspector and inspector_json else {}), **(config or {}))


def summarize(records, llms) -> dict:
    """The score aggregate (as the task measures it), the fault's and defences' counts, engine counters."""
    scores = [r["score"] for r in records]
    kind = scores[0]["kind"] if scores else None
    summary = {"metric": METRICS.get(kind), **aggregate(scores)}
    if kind == "code":
        summary["pass@1"] = summary["score"]
    summary["messages"] = {k: sum(r["stats"].get(k, 0) for r in records) for k in MESSAGE_STATS}
    summary["diagnostics"] = cell_diagnostics("resilience", records)  # unread answers, invalid Inspector replies
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

    start, waited, complete = time.perf_counter(), build_wait_seconds(), False
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
                       complete=complete and len(records) == len(tasks),
                       seconds=time.perf_counter() - start - (build_wait_seconds() - waited))
        write_summary(out, summary)
    return to_json(summary)


async def run_resilience_async(system, task_name, tasks, llm, fault="none", defense="none", pm=1.0, pe=0.2,
                               error_type="semantic", faulty_role=None, rounds=None, seed=0, max_tokens=None,
                               fault_max_tokens=None, inspector_max_tokens=None, out=None, concurrency=64,
                               config=None, progress=True, sandbox_allow_missing=(), inspector_json=False) -> dict:
    """run_resilience_experiment inside a running event loop (to gather several runs on one engine)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    sys_obj = make_system(system, faulty_role, rounds)
    out = Path(out or f"runs/resilience/{task_name}/{system}/{label(fault, defense)}")
    fault_obj = build_fault(fault, pm, pe, error_type, seed, fault_max_tokens, out / "autotransform.json")
    recorded = settings(sys_obj, task_name, len(tasks), fault, defense, pm, pe, error_type, seed, max_tokens,
                        fault_max_tokens, inspector_max_tokens, config, inspector_json)
    return await _run(sys_obj, task_name, tasks, llm, fault_obj,
                      build_defense(defense, inspector_max_tokens, inspector_json),
                      recorded, out, asyncio.Semaphore(concurrency), seed, _agent_params(max_tokens), progress,
                      f"{system} {label(fault, defense)}", sandbox_allow_missing)


def run_resilience_experiment(system, task_name, tasks, llm, fault="none", defense="none", pm=1.0, pe=0.2,
                              error_type="semantic", faulty_role=None, rounds=None, seed=0, max_tokens=None,
                              fault_max_tokens=None, inspector_max_tokens=None, out=None, concurrency=64,
                              config=None, progress=True, table=True, sandbox_allow_missing=(),
                              inspector_json=False) -> dict:
    """Run `system` (a name of SYSTEMS) on every task, resuming from OUT; returns the summary written to
    OUT/summary.json. fault: none | autotransform | autoinject (pm, pe, error_type); defense: none |
    challenger | inspector | both; faulty_role None: the system's default; rounds None: its default.
    max_tokens: the agents' reply limit; fault_max_tokens / inspector_max_tokens: those of the LLM that
    writes the faults and of the Inspector (None: their defaults). seed: the agents' and AutoInject's
    sampling seeds. config: extra settings to record (model, backend, data); a rerun into an OUT written
    with a different configuration is refused. out None: runs/resilience/<task>/<system>/<condition>.
    sandbox_allow_missing: the sandbox protections (sandbox.PROTECTIONS) generated code may run without.
    inspector_json: the Inspector's replies held to its JSON decision by a grammar (build_defense)."""
    summary = asyncio.run(run_resilience_async(system, task_name, tasks, llm, fault, defense, pm, pe, error_type,
                                               faulty_role, rounds, seed, max_tokens, fault_max_tokens,
                                               inspector_max_tokens, out, concurrency, config, progress,
                                               sandbox_allow_missing, inspector_json))
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
                                     progress=True, sandbox_allow_missing=(), inspector_json=False) -> dict:
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
                                fault_max_tokens, inspector_max_tokens, config, inspector_json)
            check_resume(run_dir, recorded)  # every run checked before any starts
            dirs.append(run_dir)
            runs.append((sys_obj, faults[f], build_defense(d, inspector_max_tokens, inspector_json), recorded, run_dir,
                         f"{name} {label(f, d)}"))
    start, waited = time.perf_counter(), build_wait_seconds()
    summaries = await asyncio.gather(*(_run(s, task_name, tasks, llm, fo, do, rec, path, gate, seed,
                                            _agent_params(max_tokens), progress, desc, sandbox_allow_missing)
                                       for s, fo, do, rec, path, desc in runs))
    report = resilience_report(summaries)
    report["runs"] = [str(p.relative_to(out)) for p in dirs]
    report["seconds"] = time.perf_counter() - start - (build_wait_seconds() - waited)  # not another's build
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


__all__ = ["TASKS", "METRICS", "make_system", "build_fault", "build_defense", "settings", "summarize",
           "run_resilience_async", "run_resilience_experiment", "print_summary", "run_resilience_sweep_async",
           "run_resilience_sweep", "write_report"]
