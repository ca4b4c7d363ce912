"""`byzantium ...`: the command line.

    byzantium demo                      MAJ vs RRMaj, corruption sweep 0c5t..5c0t, on the embedded model
    byzantium generate "prompt" ...     generate for prompts given on the command line
    byzantium run maj|rr|rrmaj ...      MAJ / RR / RRMaj ("The Consensus Trap") over many questions
    byzantium run sac|cpwbft ...        SAC / CP-WBFT ("Robust Multi-Agent LLMs under Byzantine Faults")
    byzantium run resilience ...        six collaboration systems with a faulty agent, AutoInject/AutoTransform,
                                        Challenger/Inspector ("On the Resilience of LLM-Based Multi-Agent ...")
    byzantium sweep FILE.toml --out DIR every cell of an experiment file (a paper's table), one engine per model
    byzantium report DIR... [--format md|csv|tex]   the papers' tables (95 % CIs, published numbers beside)
    byzantium plot DIR... [--out PLOTDIR]            the papers' figures as PNGs
    byzantium profile run <method> ...  a run with the engine profiling: profile.json, trace.json and
                                        profile.png in its out dir, a table per tag and phase
    byzantium serve --model M ...       an OpenAI-compatible server on the engine (see server.py)

    byzantium run rrmaj --agents 5 --corrupt 3 --chunk 32 --trajectories 5 --max-len 128 \
        --attack strong --task gen-track --limit 20 --out runs/rrmaj
    byzantium run sac --agents 7 --weak 2 --byzantine 1 --adversary fixed --f 3 --rounds 6 \
        --topology merg --task gen-arith --limit 20 --score-mode logprob --out runs/sac
    byzantium run resilience --system all --sweep --task humaneval --data HumanEval.jsonl.gz \
        --fault autoinject --pm 1.0 --pe 0.2 --defense both --limit 20 --out runs/resilience

Each method of `run` is its own sub-command with its own flags. Bad settings are refused (exit code 2,
a message naming the problem) before any model is loaded.
"""
import argparse
import json
import sys
import time
from pathlib import Path

from .backends import add_backend_args, check_models, pool_kwargs

DEMO_QUESTIONS = 20  # `byzantium demo`: questions per configuration (about 2-3 minutes on 2 CPU cores)


def engine_args(ap):
    ap.add_argument("--model", default=None, help="smollm2-135m (default), an HF directory, a .gguf file or a hub id")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16 (default: bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--trace", default=None, help="write the engine's steps as a Chrome trace to this file")


def make_engine(args):
    from . import Engine, SamplingParams
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)  # checked first
    return Engine(args.model, device=args.device, dtype=args.dtype), params


def print_stats(engine, seconds, trace):
    s = engine.stats
    print(f"\n{s['steps']} steps in {seconds:.1f} s; batch of up to {s['max_batch_seqs']} sequences; "
          f"prefill {s['prefill_tokens']} tokens ({s['prefill_tok_per_s']:.0f} tok/s), "
          f"decode {s['decode_tokens']} tokens ({s['decode_tok_per_s']:.1f} tok/s), "
          f"{s['cached_tokens']} prompt tokens from the prefix cache, {s['preemptions']} preemptions")
    if trace:
        engine.step_records.to_chrome_trace(trace)
        print(f"Chrome trace written to {trace}")


def cmd_demo(args):
    from .experiments.demo import run_demo
    run_demo(questions=args.questions, out=args.out, progress=not args.no_progress)


def cmd_generate(args):
    engine, params = make_engine(args)
    start = time.perf_counter()
    if args.chat:
        outputs = engine.chat([[{"role": "user", "content": p}] for p in args.prompts], params)
    else:
        outputs = engine.generate(args.prompts, params)
    for prompt, out in zip(args.prompts, outputs):
        if args.json:
            print(json.dumps({"prompt": prompt, "text": out.text, "finish_reason": out.finish_reason,
                              "tokens": len(out.token_ids)}))
        else:
            print(f"--- {prompt}\n{out.text}")
    if not args.json:
        print_stats(engine, time.perf_counter() - start, args.trace)


def task_args(ap, default_limit):
    ap.add_argument("--task", default=None,
                    help="gen-arith (default), gen-track, gen-order, or a dataset format with --data "
                         "(detected from the file when not given)")
    ap.add_argument("--data", default=None, help="a local dataset file (JSONL)")
    ap.add_argument("--limit", type=int, default=None,
                    help=f"number of questions (generators: default {default_limit}); with --data, a shuffle by "
                         "--seed picks them")
    ap.add_argument("--sample", type=int, default=None,
                    help="a data set's questions drawn at random by --sample-seed (as the papers' 128 a data "
                         "set); every cell and every --seed then sees the same questions, and --limit takes the "
                         "first of them")
    ap.add_argument("--sample-seed", type=int, default=0, help="the seed of --sample (default 0)")
    ap.add_argument("--seed", type=int, default=0)


def run_args(ap, method):
    """The flags of `run maj|rr|rrmaj`."""
    ap.add_argument("--agents", type=int, default=5, help="N agents (default 5)")
    ap.add_argument("--corrupt", type=int, default=0, help="c corrupted agents, 0..N (default 0)")
    ap.add_argument("--chunk", type=int, default=100, help="K tokens per turn (default 100)")
    ap.add_argument("--trajectories", type=int, default=None, help="M RRMaj trajectories (default N)")
    ap.add_argument("--max-len", type=int, default=512, help="L: answer length limit in tokens (default 512)")
    ap.add_argument("--attack", choices=("moderate", "strong", "directive"), default="strong",
                    help="the injection: moderate (advisory), strong (imperative; default) or directive "
                         "(the paper's Appendix C wording)")
    ap.add_argument("--order", choices=("shuffle", "rotate", "fixed"), default="shuffle",
                    help="each trajectory's speaking order: a seeded permutation (default), trajectory m "
                         "starting at agent m mod N, or 0..N-1 (corrupted agents first) for all")
    ap.add_argument("--model", default=None, help="every agent's model (default smollm2-135m)")
    ap.add_argument("--models", default=None, help="one model per agent, comma-separated")
    add_backend_args(ap)
    task_args(ap, 100)
    from .protocols.rr_prompts import TEMPERATURE
    ap.add_argument("--temperature", type=float, default=TEMPERATURE,
                    help=f"sampling temperature (default {TEMPERATURE}; each request seeded from --seed)")
    ap.add_argument("--allow-identical", action="store_true",
                    help="run even when voters or trajectories are copies by construction (temperature 0)")
    ap.add_argument("--out", default=None, help=f"output directory (default runs/{method})")
    ap.add_argument("--concurrency", type=int, default=64, help="questions in flight at once (default 64)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")


def sac_args(ap, protocol):
    """The flags of `run sac|cpwbft` (the paper's defaults: n=7 = 4 strong, 2 weak, 1 adversarial; F=3; T=6)."""
    ap.add_argument("--agents", type=int, default=7, help="n agents (default 7)")
    ap.add_argument("--weak", type=int, default=2, help="faulty agents on the weak model (default 2)")
    ap.add_argument("--byzantine", type=int, default=1, help="adversarial agents (default 1)")
    ap.add_argument("--adversary", choices=("fixed", "decoy", "equivocate"), default="fixed",
                    help="fixed: a cached answer verified wrong; decoy: a model writes a confident, subtly wrong "
                         "solution; equivocate: a different wrong answer to each neighbour (default fixed)")
    ap.add_argument("--f", dest="F", type=int, default=3, help="F: neighbours each agent may drop (default 3)")
    ap.add_argument("--rounds", type=int, default=6, help="T rounds (default 6)")
    ap.add_argument("--topology", choices=("merg", "complete", "er", "preferential"), default=None,
                    help="the graph, verified (F+1)-robust (default merg)")
    ap.add_argument("--graph", default=None, metavar="FILE",
                    help="instead of --topology: an explicit edge list, JSON [[u, v], ...] on agents 0..n-1 "
                         "(e.g. another code base's graph), checked like any topology")
    ap.add_argument("--strong-model", default=None, help="the strong agents' model (default smollm2-135m)")
    ap.add_argument("--weak-model", default=None, help="the weak agents' model (default: the strong model)")
    ap.add_argument("--adversary-model", default=None, help="a decoy's model (default: the strong model)")
    add_backend_args(ap)
    task_args(ap, 100)
    ap.add_argument("--score-mode", choices=("generate", "logprob"), default="generate",
                    help="SAC scoring: the judge writes `Score: x` (generate, default) or one forward pass "
                         "(logprob)" + ("; CP-WBFT does not score and ignores it" if protocol == "cpwbft" else ""))
    ap.add_argument("--max-tokens", type=int, default=1000,
                    help="new tokens per solve, refine or decoy solution (default 1000)")
    from .protocols.prompts import TEMPERATURE
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
    ap.add_argument("--out", default=None, help=f"output directory (default runs/{protocol})")
    ap.add_argument("--concurrency", type=int, default=64, help="problems in flight at once (default 64)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")


def load_questions(args):
    """The questions named by --task / --data / --limit / --seed (a ValueError naming a bad one)."""
    from .tasks import FORMATS, HUB, TASKS, get_task, load_task, sample_tasks
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    sample = getattr(args, "sample", None)
    if sample is not None and sample < 1:
        raise ValueError(f"--sample must be >= 1, got {sample}")
    if sample is not None and args.data is None and args.task not in HUB:
        raise ValueError("--sample draws from a data set (--data FILE or a dataset name); a generator's --limit "
                         "is its number of problems")
    # With --sample: the whole set, the sample drawn, then --limit cuts it (in the data set's order).
    limit, seed = (None, None) if sample is not None else (args.limit, args.seed)
    if args.data is not None:
        if not Path(args.data).is_file():
            raise ValueError(f"--data {args.data!r}: no such file")
        if args.task is not None and args.task not in FORMATS:
            raise ValueError(f"unknown --task {args.task!r} for --data; dataset formats: {', '.join(FORMATS)}")
        tasks = load_task(args.data, limit=limit, seed=seed, format=args.task)
    elif (args.task or "gen-arith") in TASKS:
        tasks = get_task(args.task or "gen-arith", 100 if args.limit is None else args.limit, args.seed)
    elif args.task in HUB:
        tasks = load_task(args.task, limit=limit, seed=seed)
    else:
        raise ValueError(f"unknown --task {args.task!r}; choose one of {', '.join(TASKS)}, "
                         f"or a dataset ({', '.join(FORMATS)}) with --data FILE")
    if sample is not None:
        tasks = sample_tasks(tasks, sample, args.sample_seed)[:args.limit]
    if not tasks:
        raise ValueError("no questions to run")
    return tasks


def prepare_run(args):
    """Check every argument and load the questions; nothing heavy is loaded here."""
    from .engine.loader import DEFAULT_MODEL
    from .experiments.rr import check_config
    m = args.trajectories if args.trajectories is not None or args.method != "rrmaj" else args.agents
    check_config(args.method, args.agents, args.corrupt, args.chunk, m, args.max_len, args.attack,
                 args.temperature, args.order, allow_identical=True)  # the settings alone first
    if args.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.models is not None:
        if args.model is not None:
            raise ValueError("give --model or --models, not both")
        models = [name.strip() for name in args.models.split(",")]
        if len(models) != args.agents or not all(models):
            raise ValueError(f"--models names {len(models)} models for --agents {args.agents}; give one per agent")
    else:
        models = [args.model] * args.agents
    # Copies by construction (temperature 0, same model and prompt) are refused here, before any load.
    check_config(args.method, args.agents, args.corrupt, args.chunk, m, args.max_len, args.attack,
                 args.temperature, args.order, [name or DEFAULT_MODEL for name in models],
                 allow_identical=args.allow_identical)
    tasks = load_questions(args)
    check_models(args, models)
    return models, tasks, (m if args.method == "rrmaj" else None)


def already_done(out, tasks, print_table):
    """True (after printing the recorded table) when OUT holds every question and a summary."""
    from .experiments.runner import SUMMARY, is_error, read_results
    done = {r["id"] for r in read_results(out) if not is_error(r)} if Path(out).is_dir() else set()
    if all(task.id in done for task in tasks) and (Path(out) / SUMMARY).is_file():
        print(f"all {len(tasks)} questions already done in {out}; nothing to run")
        print_table(json.loads((Path(out) / SUMMARY).read_text()))
        return True
    return False


def engine_kwargs(args):
    """The pool's kwargs: --device/--dtype, or the server's (--backend openai: --base-url, the key)."""
    return pool_kwargs(args)


def run_pool(args, **engine):
    """The run's LLMPool; `byzantium profile` hands in its own (args.pool), whose engines profile."""
    from .backends import LLMPool
    return getattr(args, "pool", LLMPool)(args.backend, **engine)


def cmd_run(args):
    from .backends import DEFAULT_MODEL
    from .experiments.rr import print_table, run_rr_experiment, settings
    from .experiments.runner import check_resume
    models, tasks, m = prepare_run(args)
    out = args.out or f"runs/{args.method}"
    config = dict(models=[name or DEFAULT_MODEL for name in models], backend=args.backend,
                  task=args.task or ("gen-arith" if args.data is None else None), data=args.data)
    check_resume(out, settings(args.method, args.agents, args.corrupt, args.chunk, m, args.max_len, args.attack,
                               args.temperature, args.seed, 0, config, args.order))  # before any model loads
    if already_done(out, tasks, print_table):
        return
    kwargs = engine_kwargs(args)
    with run_pool(args, **kwargs) as pool:
        pool.plan(models)  # several models on one GPU: each gets its share (LLMPool.plan)
        llms = [pool.get(name) for name in models]
        run_rr_experiment(args.method, tasks, llms, args.corrupt, args.chunk, m, args.max_len, args.attack,
                          args.temperature, args.seed, out, concurrency=args.concurrency, config=config,
                          progress=not args.no_progress, order=args.order, allow_identical=args.allow_identical)
    print(f"results in {out}/results.jsonl, summary in {out}/summary.json")


def prepare_sac(args):
    """Check every argument of `run sac|cpwbft` (graph included) and load the questions; loads no model.
    Returns (sampling params, model names, questions, the --graph edges or None); sets args.topology
    ("edges" for --graph)."""
    from . import SamplingParams
    from .engine.loader import DEFAULT_MODEL
    from .experiments.sac import check_config, read_edges
    if args.graph is not None and args.topology is not None:
        raise ValueError("give --topology or --graph, not both")
    edges = read_edges(args.graph) if args.graph is not None else None
    args.topology = "edges" if edges is not None else args.topology or "merg"
    check_config(args.method, args.agents, args.weak, args.byzantine, args.adversary, args.F, args.rounds,
                 args.topology, args.seed, args.score_mode, edges)
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
    models = {"strong": strong, "weak": weak if args.weak else None,
              "adversary": adversary if args.byzantine and args.adversary == "decoy" else None}
    tasks = load_questions(args)
    check_models(args, [m for m in models.values() if m is not None])
    return params, models, tasks, edges


def cmd_run_sac(args):
    from .experiments.runner import check_resume
    from .experiments.sac import print_table, run_experiment, settings
    (solve, judge), models, tasks, edges = prepare_sac(args)
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
                               all_rounds, len(tasks), config, edges))  # before any model loads
    if already_done(out, tasks, print_table):
        return
    with run_pool(args, **engine_kwargs(args)) as pool:
        pool.plan([m for m in models.values() if m is not None])
        strong = pool.get(models["strong"])
        weak = pool.get(models["weak"]) if models["weak"] is not None else None
        adversary = pool.get(models["adversary"]) if models["adversary"] is not None else None
        run_experiment(args.method, tasks, strong, weak, adversary, args.agents, args.weak, args.byzantine,
                       args.adversary, args.F, args.rounds, args.topology, args.seed, args.score_mode,
                       logprob_kind, solve, judge, all_rounds, out, args.concurrency, config,
                       progress=not args.no_progress, edges=edges, ra_ties=ra_ties)
    print(f"results in {out}/results.jsonl, summary in {out}/summary.json")


def resilience_args(ap, method):
    from .experiments.resilience import add_resilience_args
    add_resilience_args(ap)


def cmd_run_resilience(args):
    from .experiments.resilience import cmd_resilience
    cmd_resilience(args)


RUN_METHODS = {
    "maj": (run_args, cmd_run, "majority vote of N independent answers (\"The Consensus Trap\")"),
    "rr": (run_args, cmd_run, "token-level round-robin: N agents write one answer, K tokens a turn"),
    "rrmaj": (run_args, cmd_run, "M round-robin trajectories and a plurality vote over them"),
    "sac": (sac_args, cmd_run_sac, "Self-Anchored Consensus on an (F+1)-robust graph with Byzantine agents"),
    "cpwbft": (sac_args, cmd_run_sac, "the CP-WBFT baseline (confidence-weighted local updates)"),
    "resilience": (resilience_args, cmd_run_resilience,
                   "a collaboration structure (linear/flat/hierarchical) with a faulty agent and defences"),
}


def parser():
    ap = argparse.ArgumentParser(prog="byzantium", description="Multi-agent LLM protocols under Byzantine faults.")
    sub = ap.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="MAJ vs RRMaj across the corruption sweep on the embedded model (a few minutes)")
    demo.add_argument("--questions", type=int, default=DEMO_QUESTIONS, help=f"generated sums (default {DEMO_QUESTIONS})")
    demo.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(func=cmd_demo)
    gen = sub.add_parser("generate", help="generate for prompts given on the command line")
    gen.add_argument("prompts", nargs="+")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    gen.add_argument("--json", action="store_true", help="one JSON line per prompt")
    engine_args(gen)
    gen.set_defaults(func=cmd_generate)
    run = sub.add_parser("run", help="an experiment over many questions, resumable (--out DIR)")
    add_run_methods(run)
    sweep = sub.add_parser("sweep", help="every cell of an experiment file (TOML), e.g. a paper's table, into "
                                         "DIR/<cell>/; resumable (byzantium/experiments/configs/)")
    from .sweep import add_sweep_args
    add_sweep_args(sweep)
    sweep.set_defaults(func=cmd_sweep)
    report = sub.add_parser("report", help="the papers' tables from sweep or run directories (md, csv or tex)")
    report.add_argument("dirs", nargs="+", metavar="DIR", help="sweep directories (sweep.json) or run directories")
    report.add_argument("--format", default="md", help="md (default), csv or tex")
    report.add_argument("--out", default=None, metavar="FILE", help="write the report here (default: print it)")
    report.set_defaults(func=cmd_report)
    plot = sub.add_parser("plot", help="the papers' figures (PNG) from sweep or run directories")
    plot.add_argument("dirs", nargs="+", metavar="DIR", help="sweep directories (sweep.json) or run directories")
    plot.add_argument("--out", default=None, metavar="PLOTDIR", help="where the PNGs go (default: the first DIR/plots)")
    plot.set_defaults(func=cmd_plot)
    profile = sub.add_parser("profile", help="`profile run <method> ...`: a run with the engine profiling; "
                                             "profile.json, trace.json, profile.png in its out dir")
    profiled = profile.add_subparsers(dest="profiled", required=True, metavar="run")
    add_run_methods(profiled.add_parser("run", help="the same flags as `byzantium run`"), profiling=True)
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server on the engine (/v1/completions, "
                                         "/v1/chat/completions, /v1/sessions, /metrics)")
    from .server import add_serve_args, cmd_serve
    add_serve_args(serve)
    serve.set_defaults(func=cmd_serve)
    return ap


def add_run_methods(run, profiling=False):
    methods = run.add_subparsers(dest="method", required=True, metavar="{" + ",".join(RUN_METHODS) + "}")
    for name, (add_args, func, help) in RUN_METHODS.items():
        method = methods.add_parser(name, help=help)
        add_args(method, name)
        if profiling:
            from .experiments.profile import add_profile_args
            add_profile_args(method)
            method.set_defaults(func=cmd_profile, run=func)
        else:
            method.set_defaults(func=func)


def cmd_sweep(args):
    from .sweep import cmd_sweep as sweep
    return sweep(args)


def cmd_report(args):
    from .experiments.report import cmd_report as report
    report(args)


def cmd_plot(args):
    from .experiments.plot import cmd_plot as plot
    plot(args)


def cmd_profile(args):
    from .experiments.profile import profile_run
    profile_run(args)


def main(argv=None):
    ap = parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as exit:  # argparse's refusals (exit 2) and --help (0), as a return code
        return exit.code
    try:
        code = args.func(args)
    except (ValueError, TypeError) as error:  # bad input: a clear message, not a traceback
        print(f"byzantium: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
