"""SAC and CP-WBFT experiments ("Robust Multi-Agent LLMs under Byzantine Faults") over many problems.

    from byzantium.backends import LLMPool
    from byzantium.tasks import get_task
    with LLMPool("native") as pool:
        summary = run_experiment("sac", get_task("gen-arith", 20), pool.get(), n=7, weak=2, byzantine=1,
                                 F=3, T=6, topology="merg", out="runs/sac")

Agents 0.. are strong, then weak, then adversarial (the paper's n=7 line-up: 4, 2, 1). The graph (a
named topology, or an explicit edge list: `edges=[[u, v], ...]`, `--graph FILE`) is built once per run
and checked first: (F+1)-robust, the faulty set (weak + adversarial agents) F-local, every degree above
F. Sampling defaults to the paper's temperature 0.1; the one run seed picks the problems of a generated
task, the adversaries' wrong answers and the Erdos-Renyi graph, and seeds every request from (seed,
problem, agent, round, purpose), so a rerun writes the same transcripts. One JSONL line per problem
holds the protocol's whole transcript; summary.json holds the paper's metrics (IAA, FAA, BFTI, RA as the
paper computes it, our all-agent RA-all, H-Majority, per-group and per-round accuracy), failure counts,
the configuration and the engines' stats.
"""
import json
from pathlib import Path

from ..backends.params import SamplingParams
from ..protocols import graphs, prompts
from ..protocols.byzantine import ADVERSARY_MODES, make_agents
from ..protocols.cpwbft import run_cpwbft
from ..protocols.metrics.sac import COUNTS, GROUPS, RA_TIES, summarize as summarize_metrics
from ..protocols.sac import LOGPROB_KINDS, SCORE_MODES, Scorer, run_sac
from .rr import engine_stats
from .runner import SUMMARY, run_instances

PROTOCOLS = ("sac", "cpwbft")
TOPOLOGIES = ("merg", "complete", "er", "preferential")


def build_graph(topology, n, F, seed=0, edges=None):
    """The communication graph; preferential and Erdos-Renyi are built for r = F + 1; topology "edges"
    is the explicit edge list `edges`."""
    if topology == "edges":
        if edges is None:
            raise ValueError("topology 'edges' needs the edge list (--graph FILE)")
        return graphs.from_edges(edges, n)
    if topology == "complete":
        return graphs.complete(n)
    if topology == "merg":
        return graphs.merg(n)
    if topology == "preferential":
        return graphs.preferential(n, F + 1)
    if topology == "er":
        try:
            return graphs.erdos_renyi(n, F + 1, seed)
        except RuntimeError as error:  # no robust sample: a bad setting, reported like the others
            raise ValueError(str(error)) from None
    raise ValueError(f"unknown --topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")


def read_edges(path):
    """The edge list in a JSON file ([[u, v], ...]); ValueError naming the file and the problem."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"--graph {path}: cannot read it ({error.strerror or error})") from None
    except ValueError as error:
        raise ValueError(f"--graph {path}: not JSON ({error})") from None


def _set(nodes):
    return "{" + ", ".join(map(str, sorted(nodes))) + "}"


def check_config(protocol, n, weak, byzantine, adversary, F, T, topology, seed=0, score_mode="generate",
                 edges=None):
    """ValueError naming the bad setting (the CLI calls this before loading anything); returns the graph.
    topology "edges": the explicit edge list `edges`, checked like any built graph."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    if n < 1:
        raise ValueError(f"--agents must be >= 1, got {n}")
    if weak < 0 or byzantine < 0:
        raise ValueError(f"--weak and --byzantine must be >= 0, got {weak} and {byzantine}")
    if weak + byzantine > n:
        raise ValueError(f"--weak {weak} plus --byzantine {byzantine} is more than --agents {n}")
    if byzantine == n:
        raise ValueError(f"--byzantine {byzantine} leaves no honest agent among --agents {n}")
    if F < 0:
        raise ValueError(f"--f must be >= 0, got {F}")
    if T < 1:
        raise ValueError(f"--rounds must be >= 1, got {T}")
    if adversary not in ADVERSARY_MODES:
        raise ValueError(f"unknown --adversary {adversary!r}; choose one of {', '.join(ADVERSARY_MODES)}")
    if score_mode not in SCORE_MODES:
        raise ValueError(f"unknown --score-mode {score_mode!r}; choose one of {', '.join(SCORE_MODES)}")
    try:
        G = build_graph(topology, n, F, seed, edges)
    except ValueError as error:
        raise ValueError(f"--graph: {error} (one node per agent, --agents {n})") if topology == "edges" else error
    name = "the graph given by --graph" if topology == "edges" else f"the {topology} graph on {n} agents"

    pair = graphs.violating_pair(G, F + 1)
    if pair is not None:
        s1, s2 = pair
        raise ValueError(f"{name} is not {F + 1}-robust (F+1 with --f {F}): neither {_set(s1)} nor {_set(s2)} "
                         f"has an agent with {F + 1} neighbours outside its own set; lower --f or choose "
                         f"another graph")
    low = [i for i in sorted(G.nodes) if G.degree(i) <= F]
    if low:
        raise ValueError(f"--f {F} is not below the degree of agent {low[0]} ({G.degree(low[0])} neighbours) in "
                         f"{name}: it could drop every neighbour")
    # The paper's F counts every faulty agent (its n=7 line-up: 2 weak + 1 adversarial = F = 3).
    faulty = set(range(n - weak - byzantine, n))
    if not graphs.f_local(G, faulty, F):
        i = next(i for i in sorted(G.nodes) if i not in faulty and sum(j in faulty for j in G[i]) > F)
        raise ValueError(f"the faulty agents {_set(faulty)} (weak and adversarial) are not {F}-local in {name}: "
                         f"agent {i} has {sum(j in faulty for j in G[i])} faulty neighbours, more than --f {F}")
    return G


def settings(protocol, n, weak, byzantine, adversary, F, T, topology, seed, score_mode, logprob_kind,
             solve_params, judge_params, all_rounds, problems, config=None, edges=None):
    """The configuration recorded in summary.json (and compared on resume)."""
    judges = protocol == "sac" or (byzantine and adversary == "adaptive")  # an adaptive adversary judges too
    return dict(protocol=protocol, agents=n, strong=n - weak - byzantine, weak=weak, byzantine=byzantine,
                adversary=adversary if byzantine else None, F=F, T=T, topology=topology,
                edges=sorted(sorted(e) for e in edges) if edges is not None else None, seed=seed,
                score_mode=score_mode if judges else None,
                logprob_kind=logprob_kind if judges and score_mode == "logprob" else None,
                max_tokens=solve_params.max_tokens, temperature=float(solve_params.temperature),
                judge_max_tokens=judge_params.max_tokens if judges and score_mode == "generate" else None,
                all_rounds=bool(all_rounds) if protocol != "sac" else None, problems=problems, **(config or {}))


def summarize(records, llms, since=None):
    return {**summarize_metrics(records), "engine": engine_stats(llms, since)}


def _counts(config):
    """The failure counts that can happen under this configuration."""
    skip = {"score_failures", "score_errors", "refine_parse_failures"} if config["protocol"] == "cpwbft" \
        else {"confidence_missing"}
    if config["adversary"] != "decoy":
        skip.add("decoy_fallbacks")
    return [k for k in COUNTS if k not in skip]


def _num(x, signed=False):
    return "-" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")


def print_table(summary):
    """The paper's Table 1/2 layout: per-group accuracy by round, then the headline metrics."""
    c = summary["config"]
    line_up = f"{c['strong']} strong, {c['weak']} weak, {c['byzantine']} adversarial"
    if c["byzantine"]:
        line_up += f": {c['adversary']}"
    mode = f", {c['score_mode']} scoring" if c.get("score_mode") else ""
    graph = f"graph of {len(c['edges'])} given edges" if c.get("edges") else c["topology"]
    print(f"{c['protocol'].upper()}: n={c['agents']} ({line_up}), F={c['F']}, T={c['T']}, {graph}{mode}, "
          f"temperature {c['temperature']}, seed {c['seed']}; {summary['instances']}/{summary['total']} problems"
          + (f", {summary['errors']} failed (rerun to retry)" if summary.get("errors") else ""))
    if not summary.get("acc"):
        return
    rounds = len(summary["acc"]["all"])
    rows = [["accuracy"] + [f"Rnd {t}" for t in range(rounds)]]
    rows += [[g] + [_num(x) for x in summary["acc"][g]] for g in GROUPS]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    head = (f"IAA {_num(summary['IAA'])}  FAA {_num(summary['FAA'])}  BFTI {_num(summary['BFTI'], True)}  "
            f"RA {_num(summary['RA'])}  RA-all {_num(summary.get('RA-all'))}  H-Majority {_num(summary['H-Majority'])}")
    if "rounds_run" in summary:
        head += f"  rounds run {summary['rounds_run']:.2f}"
    print(head)
    ra = "honest agents' plurality" if c["protocol"] == "sac" else "the global decision"
    if c.get("ra_ties") == "first-honest":
        ra += ", a tie to the first honest agent (the reference's rule)"
    print(f"RA: {ra} (the paper's); RA-all: plurality of all agents, adversaries included (ours)")
    print("failures: " + ", ".join(f"{k.replace('_', ' ')} {summary[k]}" for k in _counts(c) if k in summary))
    e = summary["engine"]
    print(f"engine: prefill {e['prefill_tokens']}, decode {e['decode_tokens']}, cached {e['cached_tokens']} tokens; "
          f"{e['steps']} steps, batch of up to {e['max_batch_seqs']} sequences")


def run_experiment(protocol, tasks, strong_llm, weak_llm=None, adversary_llm=None, n=7, weak=2, byzantine=1,
                   adversary="fixed", F=3, T=6, topology="merg", seed=0, score_mode="generate",
                   logprob_kind="yes", solve_params=None, judge_params=None, all_rounds=False, out="runs/sac",
                   concurrency=64, config=None, progress=True, table=True, edges=None, ra_ties="drawn") -> dict:
    """Run SAC or CP-WBFT on every task (resuming from OUT); returns the summary written to OUT/summary.json.

    weak_llm and adversary_llm (a decoy's or an adaptive adversary's model) default to strong_llm. The
    adversaries' cache of wrong answers is the gold answers of the OTHER tasks of the run (each checked wrong
    per problem). An adaptive adversary judges its candidates with the judge SAC's receivers use (the
    Scorer of score_mode, judge_params, logprob_kind), on adversary_llm.
    solve_params / judge_params default to 1000 new tokens at the paper's temperature 0.1; their seed is
    replaced per request (from `seed`). edges: an explicit edge list [[u, v], ...] instead of `topology`.
    config: extra settings to record (model names, task, backend); a rerun into an OUT written with a
    different configuration is refused. ra_ties: SAC's RA tie rule (metrics.RA_TIES), kept in each record
    that departs from the default so that a report reads the same RA as summary.json."""
    if edges is not None:
        topology = "edges"
    graph = check_config(protocol, n, weak, byzantine, adversary, F, T, topology, seed, score_mode, edges)
    if ra_ties not in RA_TIES:
        raise ValueError(f"unknown RA tie rule {ra_ties!r}; choose one of {', '.join(RA_TIES)}")
    if logprob_kind not in LOGPROB_KINDS:
        raise ValueError(f"unknown logprob kind {logprob_kind!r}; choose one of {', '.join(LOGPROB_KINDS)}")
    weak_llm = strong_llm if weak_llm is None else weak_llm
    adversary_llm = strong_llm if adversary_llm is None else adversary_llm
    solve_params = solve_params or SamplingParams(max_tokens=1000, temperature=prompts.TEMPERATURE)
    judge_params = judge_params or SamplingParams(max_tokens=1000, temperature=prompts.TEMPERATURE)
    cache = [(t.id, t.gold) for t in tasks]
    judge = Scorer(score_mode, judge_params, logprob_kind)  # the receivers' judge, an adaptive adversary's oracle

    async def solve(task):
        agents = make_agents(strong_llm, weak_llm, n, weak, byzantine, task, cache, seed, mode=adversary,
                             adversary_llm=adversary_llm, adversary_params=solve_params, judge=judge)
        if protocol == "sac":
            record = await run_sac(task, graph, agents, F, T, score_mode, solve_params, judge_params, logprob_kind,
                                   seed=seed)
            return record if ra_ties == "drawn" else {**record, "ra_ties": ra_ties}
        return await run_cpwbft(task, graph, agents, T, solve_params, run_all_rounds=all_rounds, seed=seed)

    llms = [strong_llm] + ([weak_llm] if weak else []) + \
        ([adversary_llm] if byzantine and adversary in ("decoy", "adaptive") else [])
    recorded = settings(protocol, n, weak, byzantine, adversary, F, T, topology, seed, score_mode, logprob_kind,
                        solve_params, judge_params, all_rounds, len(tasks), config, edges)
    start = engine_stats(llms)  # summary.json counts this run's tokens only (engines shared by a sweep's cells)
    run_instances(tasks, solve, out, key=lambda t: t.id, concurrency=concurrency,
                  stats=lambda: engine_stats(llms), config=recorded,
                  summarize=lambda records: summarize(records, llms, start), desc=protocol.upper(), progress=progress)
    summary = json.loads((Path(out) / SUMMARY).read_text())
    if table:
        print_table(summary)
    return summary


def run_sac_experiment(tasks, strong_llm, **kwargs) -> dict:
    return run_experiment("sac", tasks, strong_llm, **kwargs)


def run_cpwbft_experiment(tasks, strong_llm, **kwargs) -> dict:
    return run_experiment("cpwbft", tasks, strong_llm, **kwargs)


__all__ = ["PROTOCOLS", "TOPOLOGIES", "build_graph", "read_edges", "check_config", "settings", "summarize",
           "print_table", "run_experiment", "run_sac_experiment", "run_cpwbft_experiment"]
