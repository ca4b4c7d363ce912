"""A cell through `byzantium run`'s parser and the run's checks that load nothing (no questions, no
model), so that a bad cell is refused before the sweep starts, its error mapped back to the key."""
import contextlib
import functools
import io
import re

from ..backends import DEFAULT_MODEL
from ..experiments import rr, sac
from ..experiments.resilience import make_system
from ..experiments.run_command import run_parser
from ..tasks import FORMATS, HUB, TASKS
from ..tasks.resilience import BUILTIN_TASKS, DATA_FILES
from .cells import COMMANDS, KEYS, RES, SAC, SPELLING, ConfigError


@functools.cache
def cell_parser():
    """The `run` parser, built once (a sweep parses every cell with it)."""
    return run_parser()


def parse_cell(cell, where, extra=()):
    """The cell's argv through `byzantium run`'s parser and its checks that load nothing (no questions,
    no model); fills the params' defaults. Returns the argparse namespace; errors name the key."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = cell_parser().parse_args(cell.argv + list(extra))
    except SystemExit:
        lines = err.getvalue().strip().splitlines() or ["refused by the run parser"]
        raise ConfigError(_blame(cell, where, lines[-1].split("error: ", 1)[-1])) from None
    try:
        _static_checks(cell.method, args)
    except ValueError as error:
        raise ConfigError(_blame(cell, where, str(error))) from None
    # The settings every cell's params show, defaults filled as its method's run fills them, so that
    # `published` entries and the report match them whether or not the file spelled them out.
    for dest, value in COMMANDS[cell.method].sweep_shown(args).items():
        cell.params.setdefault(SPELLING.get(dest, dest), value)
    return args


def _blame(cell, where, message):
    """`file: [axes].corrupt: message` for the first key whose flag the message names."""
    for key, source in cell.sources.items():
        flag = KEYS.get(key, (None,))[0]
        if flag and re.search(re.escape(flag) + r"(?![\w-])", message):
            return f"{where}: {source}.{key}: {message} (cell {cell.name})"
        if key == "pattern" and re.search(r"--(agents|corrupt)(?![\w-])", message):
            return f"{where}: {source}.pattern: {message} (cell {cell.name})"
    return f"{where}: cell {cell.name}: {message}"


def _static_checks(method, args):
    """What prepare_run / prepare_sac / prepare_resilience check, without loading questions or models."""
    for flag in ("limit", "sample", "concurrency", "max_tokens", "judge_max_tokens", "fault_max_tokens",
                 "inspector_max_tokens", "rounds"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if method in RES:
        for flag in ("pm", "pe"):
            if not 0.0 <= getattr(args, flag) <= 1.0:
                raise ValueError(f"--{flag} must be a probability in [0, 1], got {getattr(args, flag)}")
        if args.system == "all":
            raise ValueError("--system all: a sweep names its systems as an axis, one per cell")
        make_system(args.system, args.faulty_role, args.rounds)
        if args.task not in BUILTIN_TASKS and args.data is None:
            raise ValueError(f"--task {args.task} needs its data: --data {DATA_FILES[args.task]}")
        return
    if args.data is None and (args.task or "gen-arith") not in TASKS and args.task.split(":")[0] not in HUB:
        raise ValueError(f"unknown --task {args.task!r}; choose one of {', '.join(TASKS)}, a dataset name "
                         f"({', '.join(HUB)}), or a format with --data FILE")
    if args.data is not None and args.task is not None and args.task not in FORMATS:
        raise ValueError(f"unknown --task {args.task!r} for --data; dataset formats: {', '.join(FORMATS)}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    if method in SAC:
        sac.check_config(method, args.agents, args.weak, args.byzantine, args.adversary, args.F, args.rounds,
                     args.topology or "merg", args.seed, args.score_mode, None, args.robustness)
        return
    m = args.trajectories if args.trajectories is not None or method != "rrmaj" else args.agents
    models = args.models.split(",") if args.models else [args.model] * args.agents
    rr.check_config(method, args.agents, args.corrupt, args.chunk, m, args.max_len, args.attack, args.temperature,
                 args.order, [n or DEFAULT_MODEL for n in models], allow_identical=args.allow_identical)
