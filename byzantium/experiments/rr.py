"""MAJ, RR and RRMaj experiments ("The Consensus Trap") over many questions, through the runner.

    from byzantium.backends import LLMPool
    from byzantium.tasks import get_task
    with LLMPool("native") as pool:
        summary = run_rr_experiment("rrmaj", get_task("gen-track", 20), pool.get(), corrupt=3, n=5,
                                    k=32, m=5, max_len=128, out="runs/rrmaj")

One JSONL line per question (every agent's answer, or every trajectory's speaking order, chunks and
authors); summary.json holds `accuracy`, the configuration, per-method details, parse failures (answer
None) and the engine's stats summed over the distinct models.

Sampling defaults to temperature 0.7 with a seed per request from (seed, question, trajectory, turn)
or (seed, question, agent): a rerun writes the same transcripts. A run whose voters (MAJ) or
trajectories (RRMaj) are copies of each other by construction is refused unless allowed explicitly.
"""
import json
from pathlib import Path

from ..protocols.attacks import ATTACK_MODES, ATTACKS, CANDIDATES, make_agents
from ..protocols.metrics.diagnostics import cell_diagnostics
from ..protocols.round_robin import ORDERS, round_robin, rr_majority, speaking_order
from ..protocols.rr_prompts import TEMPERATURE
from ..protocols.voting import majority_vote
from ..tasks import is_correct
from .runner import SUMMARY, run_instances, to_json

METHODS = ("maj", "rr", "rrmaj")
ENGINE_KEYS = ("prefill_tokens", "decode_tokens", "cached_tokens", "prefill_seconds", "decode_seconds",
               "steps", "max_batch_seqs", "preemptions", "requests")


def identical_by_construction(method, models, corrupted, m, order, temperature):
    """Why the run's voters (MAJ) or RRMaj trajectories would be copies of each other, or None.

    At temperature 0 an agent's text is a function of its context (model, prompt): two MAJ agents with
    the same model and injection cast the same vote, and two trajectories whose turns go to the same
    contexts in the same order are the same trajectory. A shuffled order can repeat by chance, which
    is not refused."""
    if temperature > 0 or method == "rr":
        return None
    contexts = [(model, bool(bad)) for model, bad in zip(models, corrupted)]
    if method == "maj":
        for i, context in enumerate(contexts):
            j = contexts.index(context)
            if j != i:
                return f"MAJ agents {j} and {i} have the same model and prompt: at temperature 0 they vote the same"
        return None
    if m < 2:
        return None
    if len(set(contexts)) == 1:
        return (f"all {len(contexts)} agents have the same model and prompt: at temperature 0 the M={m} "
                "trajectories are one")
    if order != "shuffle":
        seen = {}
        for j in range(m):
            turns = tuple(contexts[a] for a in speaking_order(len(contexts), order, index=j))
            if turns in seen:
                return (f"with --order {order}, trajectories {seen[turns]} and {j} give the same models and prompts "
                        "the same turns: at temperature 0 they are one trajectory")
            seen[turns] = j
    return None


def check_config(method, n, corrupt, k, m, max_len, attack, temperature, order="shuffle", models=None,
                 corrupted=None, allow_identical=False, attack_mode="inject", candidates=CANDIDATES):
    """ValueError naming the bad setting (the CLI calls this before loading anything).

    models: one model (name or LLM) per agent (default: all on one); corrupted: one flag per agent
    (default: agents 0..c-1); attack_mode: how RR's corrupted agents write (MAJ: only "inject")."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if n < 1:
        raise ValueError(f"--agents must be >= 1, got {n}")
    if not 0 <= corrupt <= n:
        raise ValueError(f"--corrupt must be between 0 and --agents ({n}), got {corrupt}")
    if k < 1:
        raise ValueError(f"--chunk (K) must be >= 1, got {k}")
    if m is not None and m < 1:
        raise ValueError(f"--trajectories (M) must be >= 1, got {m}")
    if max_len < 1:
        raise ValueError(f"--max-len must be >= 1, got {max_len}")
    if attack not in ATTACKS:
        raise ValueError(f"unknown --attack {attack!r}; choose one of {', '.join(ATTACKS)}")
    if temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {temperature}")
    if order not in ORDERS:
        raise ValueError(f"unknown --order {order!r}; choose one of {', '.join(ORDERS)}")
    if attack_mode not in ATTACK_MODES:
        raise ValueError(f"unknown --attack-mode {attack_mode!r}; choose one of {', '.join(ATTACK_MODES)}")
    if method == "maj" and attack_mode != "inject":
        raise ValueError(f"--attack-mode {attack_mode} needs a shared trajectory: MAJ's agents answer alone "
                         "(its corrupted agents are the injected ones)")
    if candidates < 1:
        raise ValueError(f"--candidates must be >= 1, got {candidates}")
    models = [None] * n if models is None else list(models)
    corrupted = [i < corrupt for i in range(n)] if corrupted is None else list(corrupted)
    reason = identical_by_construction(method, models, corrupted, n if m is None else m, order, temperature)
    if reason and not allow_identical:
        raise ValueError(f"{reason}. Sample (--temperature > 0; default {TEMPERATURE}) or pass --allow-identical "
                         "to run it anyway")


def engine_stats(llms, since=None):
    """The engines' counters summed over the distinct models (plus each model's own). since: an earlier
    engine_stats of the same llms; the counters are then this run's alone (an engine shared by a
    sweep's cells keeps counting across them), and "since_start" says so."""
    distinct = list({id(llm): llm for llm in llms}.values())
    total = {key: 0 for key in ENGINE_KEYS}
    per_model = {}
    for llm in distinct:
        stats = dict(llm.stats or {})
        per_model[getattr(llm, "name", str(len(per_model)))] = stats
        for key in ENGINE_KEYS:
            value = stats.get(key, 0) or 0
            total[key] = max(total[key], value) if key == "max_batch_seqs" else total[key] + value
    if since is not None:
        for key in ENGINE_KEYS:
            if key != "max_batch_seqs":
                total[key] -= since.get(key, 0) or 0
        total["since_start"] = True
    if len(distinct) > 1:
        total["per_model"] = per_model
    # which code, kernels, dtype and KV pool produced these numbers (a fallback shows here too)
    total["engines"] = {getattr(llm, "name", str(i)): llm.describe() if hasattr(llm, "describe") else {}
                        for i, llm in enumerate(distinct)}
    return total


def _mean(values):
    values = list(values)
    return sum(values) / len(values) if values else None


def _details(method, records):
    """Numbers beyond accuracy: per-agent (MAJ) or per-trajectory (RR, RRMaj) accuracy and failures."""
    from ..protocols.metrics.rr import final_chunk  # here: it imports scipy, which refusals need not wait for
    if method == "maj":
        answers = [(a, r) for r in records for a in r["agents"]]
        def ok(group):
            return _mean(is_correct(a["answer"], r["gold"], r["kind"]) for a, r in group)
        return {"agent_accuracy_honest": ok([(a, r) for a, r in answers if not a["corrupted"]]),
                "agent_accuracy_corrupted": ok([(a, r) for a, r in answers if a["corrupted"]]),
                "agent_parse_failures": sum(a["answer"] is None for a, _ in answers),
                "distinct_replies": _mean(len({a["text"] for a in r["agents"]}) for r in records),
                "ties": sum(r["vote"]["tie"] for r in records)}
    trajectories = [t for r in records for t in (r["trajectories"] if method == "rrmaj" else [r])]
    last = [speaker["corrupted"] for speaker in map(final_chunk, trajectories) if speaker is not None]
    details = {"trajectories": len(trajectories),
               "trajectory_accuracy": _mean(t["correct"] for t in trajectories),
               "trajectory_parse_failures": sum(t["answer"] is None for t in trajectories),
               "finished_by_eos": sum(t["finish_reason"] == "stop" for t in trajectories),
               "mean_tokens": _mean(t["num_tokens"] for t in trajectories),
               "last_speaker_corrupted": _mean(last)}
    if method == "rrmaj":  # mean distinct trajectory texts per question, of M
        details["distinct_trajectories"] = _mean(len({t["text"] for t in r["trajectories"]}) for r in records)
        details["ties"] = sum(r["vote"]["tie"] for r in records)
    return details


def summarize(method, records, llms, since=None):
    return {"method": method,
            "accuracy": _mean(r["correct"] for r in records),
            "correct": sum(r["correct"] for r in records),
            "parse_failures": sum(r["answer"] is None for r in records),
            "details": _details(method, records),
            "diagnostics": cell_diagnostics(method, records),  # answers read as unread or ambiguous
            "engine": engine_stats(llms, since)}


def print_table(summary):
    c, d = summary["config"], summary["details"]
    config = f"{c['corrupt']}c{c['agents'] - c['corrupt']}t"
    attack = c["attack"] + (f", {c['attack_mode']}" if c.get("attack_mode") else "") + \
        (f" x{c['candidates']}" if c.get("attack_mode") == "logprob" else "")
    if c["method"] != "maj":
        config += f" K={c['k']} L={c['max_len']}" + (f" M={c['m']}" if c["method"] == "rrmaj" else "")
        config += f" order={c.get('order')}"
    config += f" T={c['temperature']:g}"
    acc = summary["accuracy"]
    e = summary["engine"]
    rows = [("method", "config", "attack", "questions", "errors", "accuracy", "parse fail", "prefill", "decode",
             "cached"),
            (c["method"].upper(), config, attack, f"{summary['instances']}/{summary['total']}",
             str(summary.get("errors", 0)), "-" if acc is None else f"{acc:.3f}", str(summary["parse_failures"]), str(e["prefill_tokens"]),
             str(e["decode_tokens"]), str(e["cached_tokens"]))]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    extra = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in d.items() if v is not None)
    print(f"({extra})")


def settings(method, n, corrupt, k, m, max_len, attack, temperature, seed, attack_seed=0, config=None,
             order="shuffle", attack_mode="inject", candidates=CANDIDATES):
    """The configuration recorded in summary.json (and compared on resume). An attack mode other than the
    paper's injection is recorded (with a logprob-guided agent's candidates); the default is not, so runs
    written before attack modes existed still resume."""
    adaptive = {} if attack_mode == "inject" else dict(attack_mode=attack_mode)
    if attack_mode == "logprob":
        adaptive["candidates"] = candidates
    return dict(method=method, agents=n, corrupt=corrupt, k=k if method != "maj" else None,
                m=(n if m is None else m) if method == "rrmaj" else None, max_len=max_len, attack=attack,
                temperature=float(temperature), seed=seed, attack_seed=attack_seed,
                order=order if method != "maj" else None, **adaptive, **(config or {}))


def run_rr_experiment(method, tasks, llms, corrupt=0, k=100, m=None, max_len=512, attack="strong",
                      temperature=TEMPERATURE, seed=0, out="runs/rr", n=None, attack_seed=0, concurrency=64,
                      config=None, progress=True, table=True, order="shuffle", allow_identical=False,
                      attack_mode="inject", candidates=CANDIDATES) -> dict:
    """Run `method` on every task (resuming from OUT); returns the summary written to OUT/summary.json.

    llms: one LLM shared by n agents, or a list with one per agent. m: RRMaj trajectories (default N).
    order: each trajectory's speaking order (shuffle, rotate or fixed). attack_mode: how RR's corrupted
    agents write (attacks.ATTACK_MODES; MAJ: "inject" only); candidates: a logprob-guided agent's samples a
    turn. config: extra settings to record (model names, task, backend); a rerun into an OUT written with a
    different configuration is refused."""
    agents = make_agents(llms, corrupt, n)
    n = len(agents)
    m = n if m is None else m
    c = sum(a.corrupted for a in agents)
    llm_list = [a.llm for a in agents]
    check_config(method, n, c, k, m, max_len, attack, temperature, order, llm_list, [a.corrupted for a in agents],
                 allow_identical, attack_mode, candidates)

    async def solve(task):
        if method == "maj":
            result = await majority_vote(task, agents, attack, max_len, temperature, seed, attack_seed)
        elif method == "rr":
            result = await round_robin(task, agents, k, max_len, attack, temperature, seed, 0, attack_seed, order,
                                       attack_mode, candidates)
        else:
            result = await rr_majority(task, agents, m, k, max_len, attack, temperature, seed, attack_seed, order,
                                       attack_mode, candidates)
        return {"gold": task.accepted, "kind": task.kind, **to_json(result)}

    recorded = settings(method, n, c, k, m, max_len, attack, temperature, seed, attack_seed, config, order,
                        attack_mode, candidates)
    start = engine_stats(llm_list)  # summary.json counts this run's tokens only (cost parity per run)
    run_instances(tasks, solve, out, key=lambda t: t.id, concurrency=concurrency,
                  stats=lambda: engine_stats(llm_list), config=recorded,
                  summarize=lambda records: summarize(method, records, llm_list, start),
                  desc=method.upper(), progress=progress)
    summary = json.loads((Path(out) / SUMMARY).read_text())
    if table:
        print_table(summary)
    return summary


__all__ = ["METHODS", "identical_by_construction", "check_config", "engine_stats", "summarize", "print_table",
           "settings", "run_rr_experiment"]
