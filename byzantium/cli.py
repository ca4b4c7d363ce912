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
lists them (name, help, module), builds the parser and turns a command's refusal into an exit code. A
command's module is imported only when that command is chosen: `byzantium --help`, and a misspelled
flag, cost no torch.
"""
import argparse
import sys

from .commands import Listed

# In the order `byzantium --help` lists them; each help is its module's COMMAND.help (tests/test_cli_imports.py).
COMMANDS = [
    Listed("demo", "MAJ vs RRMaj across the corruption sweep on the embedded model (a few minutes)",
           "byzantium.experiments.demo"),
    Listed("generate", "generate for prompts given on the command line", "byzantium.generate"),
    Listed("run", "an experiment over many questions, resumable (--out DIR)", "byzantium.experiments.run_command"),
    Listed("sweep", "every cell of an experiment file (TOML), e.g. a paper's table, into DIR/<cell>/; resumable "
                    "(byzantium/experiments/configs/)", "byzantium.sweep.command"),
    Listed("report", "the papers' tables from sweep or run directories (md, csv or tex)", "byzantium.experiments.report"),
    Listed("plot", "the papers' figures (PNG) from sweep or run directories", "byzantium.experiments.plot"),
    Listed("plan", "the tensor-parallel size and quantization each model needs on N GPUs, and the KV tokens left "
                   "(loads nothing)", "byzantium.plan.command"),
    Listed("profile", "`profile run <method> ...`: a run with the engine profiling; profile.json, trace.json, "
                      "profile.png in its out dir", "byzantium.experiments.profile"),
    Listed("serve", "an OpenAI-compatible HTTP server on the engine (/v1/completions, /v1/chat/completions, "
                    "/v1/sessions, /metrics)", "byzantium.serve_command"),
]


def chosen_command(argv):
    """The command argv names (its first word that is not a flag: the top level has no flags but
    --help), or None."""
    words = [word for word in argv if not word.startswith("-")]
    names = {listed.name for listed in COMMANDS}
    return words[0] if words and words[0] in names else None


def parser(argv=None):
    """The parser. Given argv, only the command it names gets its flags (its module imported); the others
    are listed by name and help. Without argv, every command's flags (every module imported)."""
    ap = argparse.ArgumentParser(prog="byzantium", description="Multi-agent LLM protocols under Byzantine faults.")
    sub = ap.add_subparsers(dest="command", required=True)
    chosen = None if argv is None else chosen_command(argv)
    for listed in COMMANDS:
        command_parser = sub.add_parser(listed.name, help=listed.help)
        if argv is None or listed.name == chosen:
            command = listed.load()
            command.add_args(command_parser)
            if command.func is not None:
                command_parser.set_defaults(func=command.func)
    return ap


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        ap = parser(argv)
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
