"""`byzantium run sac|cpwbft ...`: the flags of SAC and CP-WBFT ("Robust Multi-Agent LLMs under
Byzantine Faults"), their checks before any model loads (the graph included), and the run
(experiments/sac.py).

    byzantium run sac --agents 7 --weak 2 --byzantine 1 --adversary fixed --f 3 --rounds 6 \
        --topology merg --task gen-arith --limit 20 --score-mode logprob --out runs/sac
"""
import argparse
from functools import partial

from ..backends import DEFAULT_MODEL, SamplingParams, add_backend_args, check_models, pool_kwargs
from ..commands import TASK_KEYS, Command, already_done, check_task_names, load_questions, run_pool, task_args
from ..protocols.byzantine import ADVERSARY_MODES
from ..protocols.prompts import TEMPERATURE
from .runner import check_resume

# experiments/sac.py (the graphs: networkx) is imported by the functions that run, not with the flags.


def count_or_share(text):
    """--weak / --byzantine: a count (2), or a share of --agents with a decimal point (0.286 = 2 of 7)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a count nor a share of the agents") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: a share of the agents is between 0 and 1")
    return value


def f_or_auto(text):
    """--f: an integer, or auto (the largest F the graph is certified for)."""
    from .sac import AUTO
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an integer nor 'auto'") from None


def sac_args(ap, protocol):
    """The flags of `run sac|cpwbft` (the paper's defaults: n=7 = 4 strong, 2 weak, 1 adversarial; F=3; T=6)."""
    ap.add_argument("--agents", type=int, default=7, help="n agents (default 7)")
    ap.add_argument("--weak", type=count_or_share, default=2,
                    help="faulty agents on the weak model: a count, or a share of --agents such as 0.286 "
                         "(rounded half up; a line-up that scales with n) (default 2)")
    ap.add_argument("--byzantine", type=count_or_share, default=1,
                    help="adversarial agents: a count or a share of --agents, as --weak (default 1)")
    ap.add_argument("--adversary", choices=ADVERSARY_MODES, default="fixed",
                    help="fixed: a cached answer verified wrong; decoy: a model writes a confident, subtly wrong "
                         "solution; equivocate: a different wrong answer to each neighbour; judge-targeted: the "
                         "fixed answer with text aimed at the judges appended; adaptive: each round the wrong "
                         "answer (its own or a neighbour's) its own model's judge scores highest (default fixed)")
    ap.add_argument("--f", dest="F", type=f_or_auto, default=3,
                    help="F: neighbours each agent may drop (default 3); auto: the largest F the graph is certified "
                         "for (its robustness - 1, below every degree; summary.json says how it was checked)")
    ap.add_argument("--robustness", type=count_or_share, default=None, metavar="R",
                    help="the robustness the preferential and er graphs are built for: a number, or a share of "
                         "--agents such as 0.4 (rounded up) (default F+1; with --f auto, 0.4 of --agents)")
    ap.add_argument("--rounds", type=int, default=6, help="T rounds (default 6)")
    ap.add_argument("--topology", choices=("merg", "complete", "er", "preferential"), default=None,
                    help="the graph, verified (F+1)-robust (default merg)")
    ap.add_argument("--graph", default=None, metavar="FILE",
                    help="instead of --topology: an explicit edge list, JSON [[u, v], ...] on agents 0..n-1 "
                         "(e.g. another code base's graph), checked like any topology")
    ap.add_argument("--strong-model", default=None, help="the strong agents' model (default smollm2-135m)")
    ap.add_argument("--weak-model", default=None, help="the weak agents' model (default: the strong model)")
    ap.add_argument("--adversary-model", default=None,
                    help="a decoy's or an adaptive adversary's model (default: the strong model)")
    add_backend_args(ap)
    task_args(ap, 100)
    ap.add_argument("--score-mode", choices=("generate", "logprob"), default="generate",
                    help="SAC scoring: the judge writes `Score: x` (generate, default) or one forward pass "
                         "(logprob); an adaptive adversary judges its candidates the same way"
                         + ("; CP-WBFT's agents do not score: only an adaptive adversary reads it"
                            if protocol == "cpwbft" else ""))
    ap.add_argument("--max-tokens", type=int, default=1000,
                    help="new tokens per solve, refine or decoy solution (default 1000)")
    ap.add_argument("--temperature", type=float, default=TEMPERATURE,
                    help=f"sampling temperature of every call (default {TEMPERATURE}, the paper's); each request "
                         "is seeded from --seed, the problem, the agent, the round and its purpose")
    if protocol == "sac":
        ap.add_argument("--judge-max-tokens", type=int, default=1000,
                        help="new tokens per judgement in generate mode (default 1000)")
        ap.add_argument("--logprob-kind", choices=("yes", "digit"), default="yes",
                        help="logprob scoring: P(Yes) (default) or the expected digit 0..9")
        ap.add_argument("--ra-ties", choices=("drawn", "first-honest"), default="drawn",
                        help="a tie in RA's vote of the honest agents: drawn with a key from --seed and the problem "
                             "(default, as every vote here) or the reference code's first honest agent")
    else:
        ap.add_argument("--all-rounds", action="store_true",
                        help="run all T rounds instead of stopping at the convergence threshold")
        ap.add_argument("--judge-max-tokens", type=int, default=1000,
                        help="new tokens per judgement of an adaptive adversary in generate mode (default 1000)")
    ap.add_argument("--out", default=None, help=f"output directory (default runs/{protocol})")
    ap.add_argument("--concurrency", type=int, default=64, help="problems in flight at once (default 64)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")


def prepare_sac(args):
    """Check every argument of `run sac|cpwbft` (graph included) and load the questions; loads no model.
    Returns (sampling params, model names, questions, the --graph edges or None, the checked graph); sets
    args.topology ("edges" for --graph)."""
    from .sac import check_config, read_edges
    if args.graph is not None and args.topology is not None:
        raise ValueError("give --topology or --graph, not both")
    edges = read_edges(args.graph) if args.graph is not None else None
    args.topology = "edges" if edges is not None else args.topology or "merg"
    graph = check_config(args.method, args.agents, args.weak, args.byzantine, args.adversary, args.F, args.rounds,
                         args.topology, args.seed, args.score_mode, edges, args.robustness)
    for flag in ("concurrency", "max_tokens", "judge_max_tokens"):
        value = getattr(args, flag, 1)
        if value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    params = (SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature),
              SamplingParams(max_tokens=getattr(args, "judge_max_tokens", 1000), temperature=args.temperature))
    strong = args.strong_model or DEFAULT_MODEL
    weak = args.weak_model or strong  # only one model is embedded: the weak agents default to it
    adversary = args.adversary_model or strong
    # Model names by role; None where no agent needs one.
    models = {"strong": strong, "weak": weak if graph.graph["weak"] else None,
              "adversary": adversary if graph.graph["byzantine"] and args.adversary in ("decoy", "adaptive") else None}
    tasks = load_questions(args)
    check_models(args, [m for m in models.values() if m is not None])
    return params, models, tasks, edges, graph


def cmd_run_sac(args):
    from .sac import print_table, run_experiment, settings
    (solve, judge), models, tasks, edges, graph = prepare_sac(args)
    out = args.out or f"runs/{args.method}"
    all_rounds = getattr(args, "all_rounds", False)  # CP-WBFT's flag
    logprob_kind = getattr(args, "logprob_kind", "yes")  # SAC's flag
    config = dict(models=models, backend=args.backend, task=args.task or ("gen-arith" if args.data is None else None),
                  data=args.data, graph=args.graph)
    ra_ties = getattr(args, "ra_ties", "drawn")  # SAC's flag
    if ra_ties != "drawn":  # recorded only when set, so that earlier runs still resume
        config["ra_ties"] = ra_ties
    check_resume(out, settings(args.method, args.agents, args.weak, args.byzantine, args.adversary, args.F,
                               args.rounds, args.topology, args.seed, args.score_mode, logprob_kind, solve, judge,
                               all_rounds, len(tasks), config, edges, graph, args.robustness))  # before any model loads
    if already_done(out, tasks, print_table):
        return
    with run_pool(args, **pool_kwargs(args)) as pool:
        pool.plan([m for m in models.values() if m is not None])
        strong = pool.get(models["strong"])
        weak = pool.get(models["weak"]) if models["weak"] is not None else None
        adversary = pool.get(models["adversary"]) if models["adversary"] is not None else None
        run_experiment(args.method, tasks, strong, weak, adversary, args.agents, args.weak, args.byzantine,
                       args.adversary, args.F, args.rounds, args.topology, args.seed, args.score_mode,
                       logprob_kind, solve, judge, all_rounds, out, args.concurrency, config,
                       progress=not args.no_progress, edges=edges, ra_ties=ra_ties, robustness=args.robustness)
    print(f"results in {out}/results.jsonl, summary in {out}/summary.json")


# The flags (by dest) an experiment file may set (--graph, a file of edges, is not one: a topology is).
SAC_KEYS = ("agents", "weak", "byzantine", "adversary", "F", "robustness", "rounds", "topology", "strong_model",
            "weak_model", "adversary_model", "score_mode", "max_tokens", "temperature", "judge_max_tokens",
            "concurrency") + TASK_KEYS


def sweep_shown(protocol, args):
    """What every sweep cell's params show (its parsed flags, defaults filled as the run fills them), so
    that a file's `published` entries and the report match a cell whether or not the file set them."""
    shown = {key: getattr(args, key) for key in ("agents", "weak", "byzantine", "adversary", "F", "rounds")}
    shown |= {"topology": "merg" if args.topology is None else args.topology, "max_tokens": args.max_tokens}
    if protocol == "sac":  # CP-WBFT's agents do not score
        shown |= {"judge_max_tokens": args.judge_max_tokens, "score_mode": args.score_mode}
    return shown | {key: getattr(args, key) for key in ("temperature", "seed", "limit")}


def sweep_tokens(protocol, params):
    """Tokens a problem generates, an upper bound (every call runs to its limit): n solves and self-scores,
    then T rounds of a refine and a judgement of each neighbour and itself per agent (CP-WBFT: no judge,
    and logprob scoring generates none)."""
    n, rounds, solve = params.get("agents", 7), params.get("rounds", 6), params.get("max_tokens") or 1000
    judges = protocol == "sac" and params.get("score_mode") == "generate"
    judge = params.get("judge_max_tokens", 1000) if judges else 0
    try:
        from .sac import check_config
        graph = check_config(protocol, n, params.get("weak", 2), params.get("byzantine", 1), params.get("adversary"),
                             params.get("F", 3), rounds, params.get("topology") or "merg", params.get("seed", 0))
        neighbours = sum(graph.degree(i) for i in graph.nodes)
    except Exception:  # a graph that cannot be built here: every agent judges every other one
        neighbours = n * (n - 1)
    return n * (solve + judge) + rounds * (n * (solve + judge) + neighbours * judge)


ANSWER_BUDGET = 64  # tokens a neighbour's final answer takes in a refine prompt (only answers travel)


def sweep_length(protocol, params, prompt_budget):
    """The context a cell needs: a refine prompt holds the neighbours' final answers (not their reasoning),
    then max_tokens, or a judgement of judge_max_tokens (SAC's, and an adaptive adversary's)."""
    judges = protocol == "sac" or params.get("adversary") == "adaptive"
    generated = max(params.get("max_tokens", 1000), params.get("judge_max_tokens", 1000) if judges else 0)
    return prompt_budget + params.get("agents", 7) * ANSWER_BUDGET + generated


def sweep_check(args):
    """prepare_sac's checks that load nothing (no questions, no model; the graph built), on a sweep's cell
    before it starts."""
    from .sac import check_config
    check_task_names(args)
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    check_config(args.method, args.agents, args.weak, args.byzantine, args.adversary, args.F, args.rounds,
                 args.topology or "merg", args.seed, args.score_mode, None, args.robustness)


RUN_METHODS = [
    Command("sac", "Self-Anchored Consensus on an (F+1)-robust graph with Byzantine agents",
            partial(sac_args, protocol="sac"), cmd_run_sac, sweep_keys=SAC_KEYS + ("logprob_kind", "ra_ties"),
            sweep_shown=partial(sweep_shown, "sac"), sweep_tokens=partial(sweep_tokens, "sac"),
            sweep_length=partial(sweep_length, "sac"), sweep_check=sweep_check),
    Command("cpwbft", "the CP-WBFT baseline (confidence-weighted local updates)",
            partial(sac_args, protocol="cpwbft"), cmd_run_sac, sweep_keys=SAC_KEYS + ("all_rounds",),
            sweep_shown=partial(sweep_shown, "cpwbft"), sweep_tokens=partial(sweep_tokens, "cpwbft"),
            sweep_length=partial(sweep_length, "cpwbft"), sweep_check=sweep_check),
]
