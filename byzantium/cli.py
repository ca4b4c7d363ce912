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
    byzantium plan MODEL... [--gpus N]   the tensor-parallel size and quantization each model needs on N GPUs
                                        and the KV tokens left (byzantium/plan/; loads nothing)
    byzantium profile run <method> ...  a run with the engine profiling: profile.json, trace.json and
                                        profile.png in its out dir, a table per tag and phase
    byzantium serve --model M ...       an OpenAI-compatible server on the engine (see server/)

    byzantium run rrmaj --agents 5 --corrupt 3 --chunk 32 --trajectories 5 --max-len 128 \
        --attack strong --task gen-track --limit 20 --out runs/rrmaj
    byzantium run sac --agents 7 --weak 2 --byzantine 1 --adversary fixed --f 3 --rounds 6 \
        --topology merg --task gen-arith --limit 20 --score-mode logprob --out runs/sac
    byzantium run resilience --system all --sweep --task humaneval --data HumanEval.jsonl.gz \
        --fault autoinject --pm 1.0 --pe 0.2 --defense both --limit 20 --out runs/resilience

Each method of `run` is its own sub-command with its own flags. Bad settings are refused (exit code 2,
a message naming the problem) before any model is loaded.

Each command is registered by the module that owns it (a `Command` in commands.py); this file only
lists them, builds the parser and turns a command's refusal into an exit code.
"""
import argparse
import sys

from . import generate
from .commands import Command, add_commands
from .experiments import demo, plot, profile, report, run_command
from .plan import command as plan_command
from .server import add_serve_args, cmd_serve
from .sweep import command as sweep_command

SERVE = Command("serve", "an OpenAI-compatible HTTP server on the engine (/v1/completions, /v1/chat/completions, "
                         "/v1/sessions, /metrics)", add_serve_args, cmd_serve)

# In the order `byzantium --help` lists them.
COMMANDS = [demo.COMMAND, generate.COMMAND, run_command.COMMAND, sweep_command.COMMAND, report.COMMAND, plot.COMMAND,
            plan_command.COMMAND, profile.COMMAND, SERVE]


def parser():
    ap = argparse.ArgumentParser(prog="byzantium", description="Multi-agent LLM protocols under Byzantine faults.")
    add_commands(ap, COMMANDS, "command")
    return ap


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
