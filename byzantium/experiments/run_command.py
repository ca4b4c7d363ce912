"""`byzantium run <method> ...`: an experiment over many questions, resumable (--out DIR). Its methods are
registered by the modules that own them (rr_command, sac_command, resilience_command), in the order
`byzantium run --help` lists them; `byzantium profile run` and the sweep's cells use the same ones.
"""
import argparse

from ..commands import Command, add_commands
from . import resilience_command, rr_command, sac_command

RUN_METHODS = rr_command.RUN_METHODS + sac_command.RUN_METHODS + resilience_command.RUN_METHODS


def add_run_methods(run):
    """Every method as a sub-command of `run` (its name in args.method); returns {name: its parser}."""
    names = "{" + ",".join(method.name for method in RUN_METHODS) + "}"
    return add_commands(run, RUN_METHODS, "method", metavar=names)


COMMAND = Command("run", "an experiment over many questions, resumable (--out DIR)", add_run_methods)


def run_parser():
    """A parser of `byzantium run ...` alone: a sweep checks and runs its cells (argv `run <method> ...`)
    with it, without the rest of the command line."""
    ap = argparse.ArgumentParser(prog="byzantium")
    add_commands(ap, [COMMAND], "command")
    return ap
