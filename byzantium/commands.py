"""The command line's registry, and what the experiment commands share.

A command is registered by the module that owns it: it declares a `Command` (its name, its help, a
function that adds its flags, the function that runs it), and `byzantium run`'s methods are Commands
too. cli.py lists the commands as `Listed` (name, help, owning module) and imports a module only for the
command that runs, so that `byzantium --help` and a misspelled flag cost no torch; the sweep builds the
`run` parser from the same Commands (experiments/run_command.py) without going through the CLI. A run
method's Command also tells the sweep which of its flags a file may vary (`sweep_keys`), which settings
every cell shows (`sweep_shown`), how many tokens a cell generates (`sweep_tokens`), the context it
needs (`sweep_length`) and its run's checks that load nothing (`sweep_check`).

Below the registry: the flags that name a run's questions (`task_args`) and the helpers the run
commands share (loading the questions, skipping a finished run, the pool a run loads its models in).
"""
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .experiments.runner import SUMMARY, is_error, read_results


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_args: Callable  # add_args(parser): the command's flags (and sub-commands)
    func: Callable | None = None  # func(args) -> exit code or None; None: its sub-commands set their own
    # A run method's word to `byzantium sweep`, so that the sweep names no method (sweep/cells.py,
    # cell_checks.py, dry_run.py, needs.py); a cell's default task is its --task flag's default (else gen-arith).
    sweep_keys: tuple = ()  # the dests of the flags an experiment file may set
    sweep_shown: Callable | None = None  # sweep_shown(args) -> {dest: value}: what every cell's params show
    sweep_tokens: Callable | None = None  # sweep_tokens(params) -> tokens a problem generates, an upper bound
    sweep_length: Callable | None = None  # sweep_length(params, prompt_budget) -> the max_model_len a cell needs
    sweep_check: Callable | None = None  # sweep_check(args): the run's checks that load nothing; ValueError


@dataclass(frozen=True)
class Listed:
    """A command as `byzantium --help` lists it, its module imported only when it is chosen."""
    name: str
    help: str
    module: str  # the module whose COMMAND is this command

    def load(self) -> Command:
        command = importlib.import_module(self.module).COMMAND
        if command.name != self.name:
            raise RuntimeError(f"{self.module}.COMMAND is {command.name!r}, listed as {self.name!r}")
        return command


def add_commands(parser, commands, dest, metavar=None):
    """Each command as a sub-command of `parser` (required, its name in args.<dest>); returns
    {name: the command's parser} so that a caller can add to them."""
    sub = parser.add_subparsers(dest=dest, required=True, metavar=metavar)
    parsers = {}
    for command in commands:
        parsers[command.name] = sub.add_parser(command.name, help=command.help)
        command.add_args(parsers[command.name])
        if command.func is not None:
            parsers[command.name].set_defaults(func=command.func)
    return parsers


TASK_KEYS = ("task", "data", "limit", "sample", "sample_seed", "seed")  # task_args's flags a sweep may set


def task_args(ap, default_limit):
    from .tasks import FORMATS, TASKS  # the names load_questions accepts, listed from its own tables
    ap.add_argument("--task", default=None,
                    help=f"a generator: {', '.join(TASKS)} (default gen-arith); or a data set: "
                         f"{', '.join(FORMATS)}, read from --data FILE (its format detected when not given) or, "
                         "without --data, from the Hugging Face hub")
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


def check_task_names(args):
    """load_questions' word on --task and --data that reads nothing (a sweep checks its cells with it
    before it starts; the data file itself is read at run time)."""
    from .tasks import FORMATS, HUB, TASKS
    if args.data is None and (args.task or "gen-arith") not in TASKS and args.task.split(":")[0] not in HUB:
        raise ValueError(f"unknown --task {args.task!r}; choose one of {', '.join(TASKS)}, a dataset name "
                         f"({', '.join(HUB)}), or a format with --data FILE")
    if args.data is not None and args.task is not None and args.task not in FORMATS:
        raise ValueError(f"unknown --task {args.task!r} for --data; dataset formats: {', '.join(FORMATS)}")


def already_done(out, tasks, print_table):
    """True (after printing the recorded table) when OUT holds every question and a summary."""
    done = {r["id"] for r in read_results(out) if not is_error(r)} if Path(out).is_dir() else set()
    if all(task.id in done for task in tasks) and (Path(out) / SUMMARY).is_file():
        print(f"all {len(tasks)} questions already done in {out}; nothing to run")
        print_table(json.loads((Path(out) / SUMMARY).read_text()))
        return True
    return False


def run_pool(args, **engine):
    """The run's LLMPool; `byzantium profile` hands in its own (args.pool), whose engines profile."""
    from .backends import LLMPool  # looked up at call time: tests put a pool that refuses to load there
    return getattr(args, "pool", LLMPool)(args.backend, **engine)
