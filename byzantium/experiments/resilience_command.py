"""`byzantium run resilience ...`: the flags of the resilience experiments (defaults: the paper's Pm
1.0, Pe 0.2, semantic errors), their checks before any model loads, and the run: one system, every
system (--system all), or clean, faulty and defended together (--sweep) with the table.

    byzantium run resilience --system all --sweep --task humaneval --data HumanEval.jsonl.gz \
        --fault autoinject --pm 1.0 --pe 0.2 --defense both --limit 20 --out runs/resilience
"""
import json
from pathlib import Path

from ..backends import BACKENDS, DEFAULT_MODEL, add_backend_args, check_models, pool_kwargs
from ..commands import Command
from ..protocols.resilience import DEFENSES, FAULTS, SYSTEMS, build_system
from ..protocols.resilience.autoinject import ERROR_TYPES
from ..protocols.resilience.structures import PARAMS as AGENT_PARAMS
from ..tasks.resilience import BUILTIN_TASKS, DATA_FILES, RESILIENCE_TASKS, load_resilience_task
from ..tasks.sandbox import PROTECTIONS, SandboxUnavailable, check_sandbox
from .resilience import (TASKS, make_system, print_summary, run_resilience_experiment, run_resilience_sweep,
                         settings, write_report)
from .resilience_table import label, resilience_report
from .runner import SUMMARY, check_resume, is_error, read_results


def add_resilience_args(ap):
    """The flags of `byzantium run resilience` (defaults: the paper's Pm 1.0, Pe 0.2, semantic errors)."""
    ap.add_argument("--system", choices=list(SYSTEMS) + ["all"], default="self-collab",
                    help="the system (default self-collab); all: every one, into OUT/<system>/<condition>")
    ap.add_argument("--task", choices=TASKS, default="gen-code",
                    help=f"{', '.join(RESILIENCE_TASKS)} (with --data), or built in: {', '.join(BUILTIN_TASKS)} "
                         "(default gen-code)")
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
    ap.add_argument("--inspector-json", action="store_true",
                    help="hold the Inspector's reply to its JSON decision with a grammar (native engine or a server "
                         "that takes response_format; default: free text, as in the paper)")
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
                  inspector_json=getattr(args, "inspector_json", False),
                  sandbox_allow_missing=tuple(getattr(args, "sandbox_allow_missing", None) or ()))
    for (name, f, d), path in run_dirs.items():  # a rerun with other settings is refused before any model loads
        check_resume(path, settings(make_system(name, args.faulty_role, args.rounds), args.task, len(tasks), f, d,
                                    args.pm, args.pe, args.error_type, args.seed, args.max_tokens,
                                    args.fault_max_tokens, args.inspector_max_tokens, config,
                                    getattr(args, "inspector_json", False)))
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


# The flags (by dest) an experiment file may set (--system all and --sweep are not: a sweep's axes are).
RESILIENCE_KEYS = ("system", "task", "data", "fault", "pm", "pe", "error_type", "faulty_role", "defense", "model",
                   "limit", "seed", "rounds", "max_tokens", "fault_max_tokens", "inspector_max_tokens",
                   "inspector_json", "concurrency")


def sweep_shown(args):
    """What every sweep cell's params show (its parsed flags), so that a file's `published` entries and
    the report match a cell whether or not the file set them; max_tokens only when set (unset: the
    agents' own limit)."""
    shown = {key: getattr(args, key) for key in ("system", "fault", "defense", "seed", "limit")}
    return shown | ({} if args.max_tokens is None else {"max_tokens": args.max_tokens})


def sweep_tokens(params):
    """Tokens a problem generates, an upper bound: the system's agent turns x max_tokens (the fault
    writer's and the inspector's calls not counted)."""
    system = make_system(params.get("system"), params.get("faulty_role"), params.get("rounds"))
    return sum(len(step) for step in system.steps) * (params.get("max_tokens") or AGENT_PARAMS.max_tokens)


HISTORY_TURNS = 4  # earlier messages an agent reads, at max_tokens each (a rough estimate)


def sweep_length(params, prompt_budget):
    """The context a cell needs: a prompt with a few earlier messages, then max_tokens."""
    return prompt_budget + (HISTORY_TURNS + 1) * params.get("max_tokens", AGENT_PARAMS.max_tokens)


def sweep_check(args):
    """prepare_resilience's checks that load nothing (no problems, no model), on a sweep's cell before it
    starts."""
    for flag in ("pm", "pe"):
        if not 0.0 <= getattr(args, flag) <= 1.0:
            raise ValueError(f"--{flag} must be a probability in [0, 1], got {getattr(args, flag)}")
    if args.system == "all":
        raise ValueError("--system all: a sweep names its systems as an axis, one per cell")
    make_system(args.system, args.faulty_role, args.rounds)
    if args.task not in BUILTIN_TASKS and args.data is None:
        raise ValueError(f"--task {args.task} needs its data: --data {DATA_FILES[args.task]}")


RUN_METHODS = [
    Command("resilience", "a collaboration structure (linear/flat/hierarchical) with a faulty agent and defences",
            add_resilience_args, cmd_resilience, sweep_keys=RESILIENCE_KEYS, sweep_shown=sweep_shown,
            sweep_tokens=sweep_tokens, sweep_length=sweep_length, sweep_check=sweep_check),
]
