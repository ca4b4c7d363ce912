"""`byzantium run maj|rr|rrmaj ...`: the flags of MAJ, RR and RRMaj ("The Consensus Trap"), their
checks before any model loads, and the run (experiments/rr.py).

    byzantium run rrmaj --agents 5 --corrupt 3 --chunk 32 --trajectories 5 --max-len 128 \
        --attack strong --task gen-track --limit 20 --out runs/rrmaj
"""
from functools import partial

from ..backends import DEFAULT_MODEL, add_backend_args, check_models, pool_kwargs
from ..commands import TASK_KEYS, Command, already_done, check_task_names, load_questions, run_pool, task_args
from ..protocols.attacks import ATTACK_MODES, CANDIDATES
from ..protocols.rr_prompts import TEMPERATURE
from .rr import check_config, print_table, run_rr_experiment, settings
from .runner import check_resume


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
    if method != "maj":  # MAJ has no shared text to aim at: its corrupted agents are the injected ones
        ap.add_argument("--attack-mode", choices=ATTACK_MODES, default="inject",
                        help="how corrupted agents write their turns: inject (the paper's: the injection appended "
                             "to their question; default), trajectory (a prompt that names the target and quotes "
                             "what the honest agents just wrote), logprob (the best of --candidates sampled "
                             "continuations by the target's log-probability)")
        ap.add_argument("--candidates", type=int, default=CANDIDATES,
                        help=f"continuations a logprob-guided agent samples a turn (default {CANDIDATES})")
    ap.add_argument("--order", choices=("shuffle", "rotate", "fixed"), default="shuffle",
                    help="each trajectory's speaking order: a seeded permutation (default), trajectory m "
                         "starting at agent m mod N, or 0..N-1 (corrupted agents first) for all")
    ap.add_argument("--model", default=None, help="every agent's model (default smollm2-135m)")
    ap.add_argument("--models", default=None, help="one model per agent, comma-separated")
    add_backend_args(ap)
    task_args(ap, 100)
    ap.add_argument("--temperature", type=float, default=TEMPERATURE,
                    help=f"sampling temperature (default {TEMPERATURE}; each request seeded from --seed)")
    ap.add_argument("--allow-identical", action="store_true",
                    help="run even when voters or trajectories are copies by construction (temperature 0)")
    ap.add_argument("--out", default=None, help=f"output directory (default runs/{method})")
    ap.add_argument("--concurrency", type=int, default=64, help="questions in flight at once (default 64)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")


def prepare_run(args):
    """Check every argument and load the questions; nothing heavy is loaded here."""
    m = args.trajectories if args.trajectories is not None or args.method != "rrmaj" else args.agents
    mode, candidates = getattr(args, "attack_mode", "inject"), getattr(args, "candidates", CANDIDATES)
    check_config(args.method, args.agents, args.corrupt, args.chunk, m, args.max_len, args.attack,
                 args.temperature, args.order, allow_identical=True, attack_mode=mode,
                 candidates=candidates)  # the settings alone first
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


def cmd_run(args):
    models, tasks, m = prepare_run(args)
    out = args.out or f"runs/{args.method}"
    config = dict(models=[name or DEFAULT_MODEL for name in models], backend=args.backend,
                  task=args.task or ("gen-arith" if args.data is None else None), data=args.data)
    mode, candidates = getattr(args, "attack_mode", "inject"), getattr(args, "candidates", CANDIDATES)
    check_resume(out, settings(args.method, args.agents, args.corrupt, args.chunk, m, args.max_len, args.attack,
                               args.temperature, args.seed, 0, config, args.order, mode,
                               candidates))  # before any model loads
    if already_done(out, tasks, print_table):
        return
    with run_pool(args, **pool_kwargs(args)) as pool:
        pool.plan(models)  # several models on one GPU: each gets its share (LLMPool.plan)
        llms = [pool.get(name) for name in models]
        run_rr_experiment(args.method, tasks, llms, args.corrupt, args.chunk, m, args.max_len, args.attack,
                          args.temperature, args.seed, out, concurrency=args.concurrency, config=config,
                          progress=not args.no_progress, order=args.order, allow_identical=args.allow_identical,
                          attack_mode=mode, candidates=candidates)
    print(f"results in {out}/results.jsonl, summary in {out}/summary.json")


# The flags (by dest) an experiment file may set, per method: MAJ's parser takes --chunk but MAJ has no
# turns, so a sweep over K runs MAJ once.
MAJ_KEYS = ("agents", "corrupt", "max_len", "attack", "order", "model", "models", "allow_identical", "temperature",
            "concurrency") + TASK_KEYS
RR_KEYS = MAJ_KEYS + ("chunk", "attack_mode", "candidates")


def sweep_shown(method, args):
    """What every sweep cell's params show (its parsed flags, defaults filled as the run fills them), so
    that a file's `published` entries and the report match a cell whether or not the file set them."""
    shown = {"agents": args.agents, "corrupt": args.corrupt}
    if method != "maj":  # MAJ has no turns
        shown["chunk"] = args.chunk
    if method == "rrmaj":
        shown["trajectories"] = args.agents if args.trajectories is None else args.trajectories  # M = N
    return shown | {key: getattr(args, key) for key in ("max_len", "attack", "temperature", "seed", "limit")}


def sweep_tokens(method, params):
    """Tokens a problem generates, an upper bound (every answer runs to L): MAJ N x L, RR L (one shared
    answer), RRMaj M x L."""
    answers = {"maj": params.get("agents", 5), "rr": 1,
               "rrmaj": params.get("trajectories") or params.get("agents", 5)}[method]
    return answers * params.get("max_len", 512)


def sweep_length(params, prompt_budget):
    """The context a cell needs: an agent's prompt, then the shared answer of L tokens."""
    return prompt_budget + params.get("max_len", 512)


def sweep_check(args):
    """prepare_run's checks that load nothing (no questions, no model), on a sweep's cell before it starts."""
    check_task_names(args)
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    m = args.trajectories if args.trajectories is not None or args.method != "rrmaj" else args.agents
    models = args.models.split(",") if args.models else [args.model] * args.agents
    check_config(args.method, args.agents, args.corrupt, args.chunk, m, args.max_len, args.attack, args.temperature,
                 args.order, [n or DEFAULT_MODEL for n in models], allow_identical=args.allow_identical)


RUN_METHODS = [
    Command("maj", "majority vote of N independent answers (\"The Consensus Trap\")",
            partial(run_args, method="maj"), cmd_run, sweep_keys=MAJ_KEYS,
            sweep_shown=partial(sweep_shown, "maj"), sweep_tokens=partial(sweep_tokens, "maj"),
            sweep_length=sweep_length, sweep_check=sweep_check),
    Command("rr", "token-level round-robin: N agents write one answer, K tokens a turn",
            partial(run_args, method="rr"), cmd_run, sweep_keys=RR_KEYS,
            sweep_shown=partial(sweep_shown, "rr"), sweep_tokens=partial(sweep_tokens, "rr"),
            sweep_length=sweep_length, sweep_check=sweep_check),
    Command("rrmaj", "M round-robin trajectories and a plurality vote over them",
            partial(run_args, method="rrmaj"), cmd_run, sweep_keys=RR_KEYS + ("trajectories",),
            sweep_shown=partial(sweep_shown, "rrmaj"), sweep_tokens=partial(sweep_tokens, "rrmaj"),
            sweep_length=sweep_length, sweep_check=sweep_check),
]
