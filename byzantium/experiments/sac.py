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
import functools
import json
import math
from pathlib import Path

from ..backends import SamplingParams
from ..protocols import graphs, prompts
from ..protocols.byzantine import ADVERSARY_MODES, make_agents
from ..protocols.cpwbft import run_cpwbft
from ..protocols.metrics.diagnostics import cell_diagnostics
from ..protocols.metrics.sac import COUNTS, GROUPS, RA_TIES, judgements, summarize as summarize_metrics
from ..protocols.sac import LOGPROB_KINDS, SCORE_MODES, Scorer, run_sac
from .rr import engine_stats
from .runner import SUMMARY, run_instances

PROTOCOLS = ("sac", "cpwbft")
TOPOLOGIES = ("merg", "complete", "er", "preferential")


def build_graph(topology, n, F, seed=0, edges=None, r=None):
    """The communication graph; preferential and Erdos-Renyi are built for r (default F + 1); topology
    "edges" is the explicit edge list `edges`. F "auto": r defaults to default_robustness(n), and the
    Erdos-Renyi sample is not resampled until r-robust (its own robustness sets F)."""
    auto = F == AUTO
    r = r or (default_robustness(n) if auto else F + 1)
    if topology == "edges":
        if edges is None:
            raise ValueError("topology 'edges' needs the edge list (--graph FILE)")
        return graphs.from_edges(edges, n)
    if topology == "complete":
        return graphs.complete(n)
    if topology == "merg":
        return graphs.merg(n)
    if topology == "preferential":
        return graphs.preferential(n, r)
    if topology == "er":
        try:
            return graphs.erdos_renyi(n, r, seed, verify=not auto)
        except RuntimeError as error:  # no robust sample: a bad setting, reported like the others
            raise ValueError(str(error)) from None
    raise ValueError(f"unknown --topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")


AUTO = "auto"  # --f auto: the largest F the graph supports


ROBUSTNESS_SHARE = 0.4


def default_robustness(n):
    """The robustness --f auto builds preferential and Erdos-Renyi graphs for (our choice: 0.4 n, at least
    2, below MERG's and the complete graph's ceil(n/2) so that they stay sparser; an Erdos-Renyi graph built
    for it is certified for less, often enough for a line-up of a fifth of n to be F-local up to n = 101)."""
    return max(2, math.ceil(ROBUSTNESS_SHARE * n))


def certificate(topology, G, r=None):
    """{"r", "check", "upper", "seconds"}: G is at least r-robust, and how that is known. A construction
    with a published proof needs no search: complete graphs are ceil(n/2)-robust (LeBlanc et al. 2013,
    Lemma 4), gamma-MERGs on odd n too (Lee & Panagou, Theorem 1), preferential(n, r) is r-robust
    (LeBlanc et al. 2013, Theorem 5) and no more (a node outside the core has degree r). Otherwise
    graphs.certify: exact search up to 20 nodes, the MILP beyond, a proven lower bound when it runs out
    of time."""
    n = G.number_of_nodes()
    half = math.ceil(n / 2)
    proofs = {"complete": (half, "proof: complete graph (LeBlanc et al. 2013, Lemma 4)"),
              "preferential": (r, "proof: preferential construction (LeBlanc et al. 2013, Theorem 5)")}
    if n % 2:
        proofs["merg"] = (half, "proof: gamma-MERG, odd n (Lee & Panagou, Theorem 1)")
    if topology in proofs and n >= 2:
        value, check = proofs[topology]
        return {"r": value, "check": check, "exact": True, "seconds": 0.0}
    return graphs.certify(G)


@functools.lru_cache(maxsize=64)
def _built(topology, n, F, seed, edges, r):
    """(graph, certificate), once per process: the CLI, the sweep's checks and the run ask for the same
    graph, and certifying a large one takes up to graphs.MILP_SECONDS."""
    G = build_graph(topology, n, F, seed, None if edges is None else [list(e) for e in edges], r)
    if F == AUTO and topology in ("preferential", "er"):
        r = r or default_robustness(n)
    elif topology in ("preferential", "er"):
        r = r or F + 1
    return G, certificate(topology, G, r)


def line_up(n, weak, byzantine):
    """(weak, byzantine) as counts: a float in [0, 1] is a share of the n agents (rounded half up), so that
    one line-up scales with n; an int is a count."""
    def count(x, flag):
        if isinstance(x, float):
            if not 0.0 <= x <= 1.0:
                raise ValueError(f"--{flag} {x}: a share of the agents is between 0 and 1")
            return math.floor(x * n + 0.5)
        return x
    return count(weak, "weak"), count(byzantine, "byzantine")


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
                 edges=None, robustness=None):
    """ValueError naming the bad setting (the CLI calls this before loading anything); returns the graph.
    topology "edges": the explicit edge list `edges`, checked like any built graph. F "auto": the largest
    F the graph is certified for (robustness - 1, below every degree). weak / byzantine: counts, or
    floats = shares of n. robustness: what preferential and Erdos-Renyi graphs are built for. The graph's
    .graph holds "F" (the F to run), "weak", "byzantine" (counts) and "robustness" (its certificate)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    if n < 1:
        raise ValueError(f"--agents must be >= 1, got {n}")
    weak, byzantine = line_up(n, weak, byzantine)
    if weak < 0 or byzantine < 0:
        raise ValueError(f"--weak and --byzantine must be >= 0, got {weak} and {byzantine}")
    if weak + byzantine > n:
        raise ValueError(f"--weak {weak} plus --byzantine {byzantine} is more than --agents {n}")
    if byzantine == n:
        raise ValueError(f"--byzantine {byzantine} leaves no honest agent among --agents {n}")
    if F != AUTO and (not isinstance(F, int) or F < 0):
        raise ValueError(f"--f must be an integer >= 0 or 'auto', got {F}")
    if isinstance(robustness, float):  # a share of n, as --weak and --byzantine take
        robustness = max(1, math.ceil(robustness * n - 1e-9))
    if robustness is not None and robustness < 1:
        raise ValueError(f"--robustness must be >= 1, got {robustness}")
    if T < 1:
        raise ValueError(f"--rounds must be >= 1, got {T}")
    if adversary not in ADVERSARY_MODES:
        raise ValueError(f"unknown --adversary {adversary!r}; choose one of {', '.join(ADVERSARY_MODES)}")
    if score_mode not in SCORE_MODES:
        raise ValueError(f"unknown --score-mode {score_mode!r}; choose one of {', '.join(SCORE_MODES)}")
    try:
        if topology == "edges":
            graphs.from_edges(edges, n)  # a bad list refused as it is, before it is made a cache key
        key = None if edges is None else tuple(tuple(e) for e in edges)
        G, cert = _built(topology, n, F, seed, key, robustness)
    except (ValueError, TypeError) as error:
        raise ValueError(f"--graph: {error} (one node per agent, --agents {n})") if topology == "edges" else error
    G = G.copy()  # the cached graph stays as built; this one carries the run's F and line-up
    name = "the graph given by --graph" if topology == "edges" else f"the {topology} graph on {n} agents"
    if F == AUTO:
        F = max(0, min(cert["r"] - 1, min((d for _, d in G.degree()), default=1) - 1))
    elif cert["r"] < F + 1:
        pair = graphs.violating_pair(G, F + 1) if cert["check"] != "bound" else None
        if pair is not None:
            s1, s2 = pair
            raise ValueError(f"{name} is not {F + 1}-robust (F+1 with --f {F}): neither {_set(s1)} nor {_set(s2)} "
                             f"has an agent with {F + 1} neighbours outside its own set; lower --f or choose "
                             f"another graph")
        if cert["check"] == "bound":
            raise ValueError(f"{name} could not be certified {F + 1}-robust (F+1 with --f {F}): the MILP ran out of "
                             f"time and the proven bound is {cert['r']}; lower --f or use --f auto")
    G.graph.update(F=F, weak=weak, byzantine=byzantine, robustness=cert)
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
             solve_params, judge_params, all_rounds, problems, config=None, edges=None, graph=None, robustness=None):
    """The configuration recorded in summary.json (and compared on resume). graph: check_config's graph,
    whose F and line-up (counts) are recorded; what --f auto, shares of n or --robustness asked for is
    recorded only when used (so that earlier runs still resume)."""
    asked = {}
    if graph is not None:
        if F == AUTO:
            asked["F_auto"] = True
        if isinstance(weak, float) or isinstance(byzantine, float):
            asked["shares"] = {"weak": weak, "byzantine": byzantine}
        F, weak, byzantine = graph.graph["F"], graph.graph["weak"], graph.graph["byzantine"]
    if robustness is not None:
        asked["robustness"] = robustness
    judges = protocol == "sac" or (byzantine and adversary == "adaptive")  # an adaptive adversary judges too
    return dict(protocol=protocol, agents=n, strong=n - weak - byzantine, weak=weak, byzantine=byzantine,
                adversary=adversary if byzantine else None, F=F, T=T, topology=topology,
                edges=sorted(sorted(e) for e in edges) if edges is not None else None, seed=seed,
                score_mode=score_mode if judges else None,
                logprob_kind=logprob_kind if judges and score_mode == "logprob" else None,
                max_tokens=solve_params.max_tokens, temperature=float(solve_params.temperature),
                judge_max_tokens=judge_params.max_tokens if judges and score_mode == "generate" else None,
                all_rounds=bool(all_rounds) if protocol != "sac" else None, problems=problems, **asked,
                **(config or {}))


def graph_facts(G):
    """What summary.json says of the graph: its certified robustness and how it was checked, its size."""
    degrees = [d for _, d in G.degree()]
    return {**G.graph["robustness"], "F": G.graph["F"], "nodes": G.number_of_nodes(), "edges": G.number_of_edges(),
            "min_degree": min(degrees, default=0), "max_degree": max(degrees, default=0)}


def _steps(llm):
    """The engine's per-step records (a native engine's), or None for backends that keep none."""
    records = getattr(getattr(llm, "engine", None), "step_records", None)
    return getattr(records, "records", None)


def scoring_batches(llms, since=None):
    """How the judges' prompts shared forward passes, from the engines' step records since `since` (step
    numbers per llm, from step_marks): scoring prefill rows (a judge prompt, or a chunk of a long one),
    how many ran in a pass with at least one other scoring row, and the passes' sizes. A judge prompt
    identical to one in the same pass rides on its row and is not counted (it cost nothing). None for
    backends without step records (OpenAI-compatible servers batch on their side, unseen here)."""
    rows = []
    for llm in {id(llm): llm for llm in llms}.values():
        steps = _steps(llm)
        if steps is None:
            return None
        first = (since or {}).get(id(llm), 0)
        for record in steps:
            if record.step > first:
                k = sum(t[2] for t in record.tags if t[0] == "score" and t[1] == "prefill")
                if k:
                    rows.append(k)
    total = sum(rows)
    return {"rows": total, "batched_rows": sum(k for k in rows if k > 1), "passes": len(rows),
            "share_batched": sum(k for k in rows if k > 1) / total if total else None,
            "mean_rows_per_pass": total / len(rows) if rows else None, "max_rows_per_pass": max(rows, default=0)}


def step_marks(llms):
    """The last step number of each engine now (scoring_batches counts the steps after it)."""
    return {id(llm): steps[-1].step if (steps := _steps(llm)) else 0 for llm in llms}


def summarize(records, llms, since=None, graph=None, marks=None):
    out = {**summarize_metrics(records), "engine": engine_stats(llms, since)}
    if records:  # unreadable replies and what the filter did, for the report's diagnostics columns
        out["diagnostics"] = cell_diagnostics(records[0].get("protocol", "sac"), records)
    if graph is not None:
        out["graph"] = graph_facts(graph)
    batches = scoring_batches(llms, marks)
    if batches is not None and batches["rows"]:
        # Per judge prompt: a prompt without a row of its own rode on an identical one's row in the same
        # pass (the same answer judged by the same model), so it shared that pass too. (A resumed run counts
        # its earlier problems' prompts but not their steps: its share reads high.)
        prompts = sum(map(judgements, records))
        riders = max(0, prompts - batches["rows"])
        out["scoring_batches"] = {**batches, "prompts": prompts, "riders": riders,
                                  "share_prompts_batched": (riders + batches["batched_rows"]) / prompts if prompts else None}
    return out


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
    g = summary.get("graph")
    if g:
        print(f"graph: {g['edges']} edges, degree {g['min_degree']}-{g['max_degree']}, {g['r']}-robust "
              f"({g['check']}{'' if g['exact'] else ', a lower bound'}); F {g['F']}" + (" (auto)" if c.get("F_auto") else ""))
    b = summary.get("scoring_batches")
    if b:
        print(f"scoring: {b['prompts']} judge prompts; {b['riders']} rode on an identical prompt's row, "
              f"{b['batched_rows']} of the {b['rows']} scoring prefill rows shared a forward pass with another: "
              f"{100 * (b['share_prompts_batched'] or 0):.1f}% of the prompts batched; {b['passes']} passes, "
              f"{b['mean_rows_per_pass']:.1f} rows a pass on average, up to {b['max_rows_per_pass']}")
    e = summary["engine"]
    print(f"engine: prefill {e['prefill_tokens']}, decode {e['decode_tokens']}, cached {e['cached_tokens']} tokens; "
          f"{e['steps']} steps, batch of up to {e['max_batch_seqs']} sequences")


def run_experiment(protocol, tasks, strong_llm, weak_llm=None, adversary_llm=None, n=7, weak=2, byzantine=1,
                   adversary="fixed", F=3, T=6, topology="merg", seed=0, score_mode="generate",
                   logprob_kind="yes", solve_params=None, judge_params=None, all_rounds=False, out="runs/sac",
                   concurrency=64, config=None, progress=True, table=True, edges=None, ra_ties="drawn",
                   robustness=None) -> dict:
    """Run SAC or CP-WBFT on every task (resuming from OUT); returns the summary written to OUT/summary.json.

    weak_llm and adversary_llm (a decoy's or an adaptive adversary's model) default to strong_llm. The
    adversaries' cache of wrong answers is the gold answers of the OTHER tasks of the run (each checked wrong
    per problem). An adaptive adversary judges its candidates with the judge SAC's receivers use (the
    Scorer of score_mode, judge_params, logprob_kind), on adversary_llm.
    solve_params / judge_params default to 1000 new tokens at the paper's temperature 0.1; their seed is
    replaced per request (from `seed`). edges: an explicit edge list [[u, v], ...] instead of `topology`.
    config: extra settings to record (model names, task, backend); a rerun into an OUT written with a
    different configuration is refused. ra_ties: SAC's RA tie rule (metrics.RA_TIES), kept in each record
    that departs from the default so that a report reads the same RA as summary.json. F "auto", weak and
    byzantine as shares of n, robustness: as check_config takes them."""
    if edges is not None:
        topology = "edges"
    graph = check_config(protocol, n, weak, byzantine, adversary, F, T, topology, seed, score_mode, edges, robustness)
    asked = (weak, byzantine, F)
    F, weak, byzantine = graph.graph["F"], graph.graph["weak"], graph.graph["byzantine"]
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
    recorded = settings(protocol, n, asked[0], asked[1], adversary, asked[2], T, topology, seed, score_mode,
                        logprob_kind, solve_params, judge_params, all_rounds, len(tasks), config, edges, graph,
                        robustness)
    start = engine_stats(llms)  # summary.json counts this run's tokens only (engines shared by a sweep's cells)
    marks = step_marks(llms)
    run_instances(tasks, solve, out, key=lambda t: t.id, concurrency=concurrency,
                  stats=lambda: engine_stats(llms), config=recorded,
                  summarize=lambda records: summarize(records, llms, start, graph, marks), desc=protocol.upper(),
                  progress=progress)
    summary = json.loads((Path(out) / SUMMARY).read_text())
    if table:
        print_table(summary)
    return summary


def run_sac_experiment(tasks, strong_llm, **kwargs) -> dict:
    return run_experiment("sac", tasks, strong_llm, **kwargs)


def run_cpwbft_experiment(tasks, strong_llm, **kwargs) -> dict:
    return run_experiment("cpwbft", tasks, strong_llm, **kwargs)


__all__ = ["PROTOCOLS", "TOPOLOGIES", "AUTO", "default_robustness", "certificate", "line_up", "build_graph",
           "read_edges", "check_config", "settings", "graph_facts", "scoring_batches", "step_marks", "summarize",
           "print_table", "run_experiment", "run_sac_experiment", "run_cpwbft_experiment"]
