"""A cell through `byzantium run`'s parser and the run's checks that load nothing (no questions, no
model), so that a bad cell is refused before the sweep starts, its error mapped back to the key."""
import contextlib
import functools
import io
import re

from ..experiments.run_command import run_parser
from .cells import COMMANDS, KEYS, SPELLING, ConfigError


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
    """What the run checks without loading questions or models: the counts every method has, then its
    method's own checks (its Command's sweep_check, beside the run's prepare_*)."""
    for flag in ("limit", "sample", "concurrency", "max_tokens", "judge_max_tokens", "fault_max_tokens",
                 "inspector_max_tokens", "rounds"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    COMMANDS[method].sweep_check(args)
