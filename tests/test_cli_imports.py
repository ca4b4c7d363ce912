"""The command line imports a command's module only when that command runs: `byzantium --help`, each
command's --help (serve's and every run method's included), `byzantium plan` and a refused flag load no
torch, FastAPI or transformers. Each case
runs in a fresh interpreter and reports what it imported (imports, not timings)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from byzantium.cli import COMMANDS
from byzantium.experiments.run_command import RUN_METHODS

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "fastapi", "transformers", "scipy")


def run_cli(*argv):
    """(exit code, stdout, stderr, the heavy modules imported) of `byzantium ARGV` in a fresh interpreter."""
    code = ("import json, sys; from byzantium.cli import main; rc = main(sys.argv[1:]); "
            f"print(json.dumps([rc, [m for m in {HEAVY!r} if m in sys.modules]]))")
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    *out, last = done.stdout.splitlines() or [""]
    rc, heavy = json.loads(last)
    return rc, "\n".join(out), done.stderr, heavy


def test_help_lists_every_command_without_heavy_imports():
    rc, out, _, heavy = run_cli("--help")
    assert rc == 0 and heavy == []
    assert all(listed.name in out for listed in COMMANDS)


# Every command, every method of `run` and every method of `profile run`, from the registries.
@pytest.mark.parametrize("argv", [[listed.name] for listed in COMMANDS] + [["profile", "run"]]
                         + [[*above, method.name] for above in (["run"], ["profile", "run"]) for method in RUN_METHODS],
                         ids=" ".join)
def test_a_commands_help_imports_nothing_heavy(argv):
    rc, out, _, heavy = run_cli(*argv, "--help")
    assert rc == 0 and heavy == [] and out.startswith(f"usage: byzantium {' '.join(argv)}")


def test_plan_imports_nothing_heavy():
    rc, out, err, heavy = run_cli("plan", "smollm2-135m", "Qwen/Qwen3-4B")
    assert rc == 0 and heavy == [], err
    assert "smollm2-135m" in out and "Qwen/Qwen3-4B" in out


@pytest.mark.parametrize("argv, said", [
    (["run", "rrmaj", "--agnets", "5"], "unrecognized arguments: --agnets"),
    (["run", "sac", "--agents", "five"], "argument --agents: invalid int value: 'five'"),
    (["sweep", "ct_table1", "--scale", "huge"], "argument --scale: invalid choice: 'huge'"),
    (["generate", "hi", "--max-tokenz", "3"], "unrecognized arguments: --max-tokenz"),
    (["rnu", "rrmaj"], "argument command: invalid choice: 'rnu'"),
    (["serve", "--prot", "8000"], "unrecognized arguments: --prot"),
    (["serve", "--port", "eighty"], "argument --port: invalid int value: 'eighty'"),
    (["serve", "--tool-call-parser", "pythonic"], "argument --tool-call-parser: invalid choice: 'pythonic'"),
])
def test_a_misspelled_flag_or_bad_value_is_refused_before_any_heavy_import(argv, said):
    rc, out, err, heavy = run_cli(*argv)
    assert rc == 2 and said in err and heavy == [], (err, heavy)


def test_serve_checks_its_flags_after_importing_the_server_and_before_loading_a_model():
    # The flags parse without the server; the run imports it (server/app.py) and refuses a bad port there.
    rc, _, err, heavy = run_cli("serve", "--port", "70000")
    assert rc == 2 and "--port must be in 0..65535, got 70000" in err and "fastapi" in heavy, (err, heavy)


def test_each_listed_command_is_its_modules_command():
    # The help `byzantium --help` shows is the owning module's, and the module defines that command.
    for listed in COMMANDS:
        command = listed.load()
        assert (command.name, command.help) == (listed.name, listed.help)
