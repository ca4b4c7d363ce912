"""How long the command line takes to answer before it does any work: `byzantium --help`, a command's
--help, a refused flag and `byzantium plan`, each in a fresh interpreter (median wall time of --repeat
runs), and which heavy modules it imported.

    python bench/cli_startup.py                       # this checkout
    python bench/cli_startup.py --tree /tmp/before    # another copy of the package (e.g. `git archive REV byzantium`)
    flock /tmp/byzantium-bench.lock python bench/cli_startup.py --record bench/results/cli_startup.md --label "after"

--record appends the table to a results file as a dated entry with the CPU model and the label.
"""
import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [["--help"], ["run", "rrmaj", "--help"], ["run", "sac", "--help"], ["sweep", "--help"], ["plan", "--help"],
         ["demo", "--help"], ["report", "--help"], ["plot", "--help"], ["serve", "--help"],
         ["run", "rrmaj", "--agnets", "5"], ["serve", "--prot", "8000"], ["plan", "smollm2-135m"]]
HEAVY = ("torch", "fastapi", "transformers", "scipy")
PROBE = ("import json, sys; from byzantium.cli import main; rc = main(sys.argv[1:]); "
         f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)")


def measure(tree, argv, repeat):
    walls = []
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tree, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), json.loads(done.stderr.strip().splitlines()[-1])


def cpu_model():
    """The CPU's model name (lscpu's, from /proc/cpuinfo), or what platform knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]),
                    help="the directory holding the byzantium package to time (default: this checkout)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--record", default=None, metavar="FILE", help="also append the table to FILE (a results .md)")
    ap.add_argument("--label", default="", help="--record: what was timed (e.g. the revision)")
    args = ap.parse_args()
    lines = [f"| command | median wall s ({args.repeat} runs) | heavy modules imported |", "|---|---|---|"]
    print("\n".join(lines), flush=True)
    for argv in CASES:
        wall, heavy = measure(args.tree, argv, args.repeat)
        lines.append(f"| `byzantium {' '.join(argv)}` | {wall:.2f} | {', '.join(heavy) or 'none'} |")
        print(lines[-1], flush=True)
    if args.record:
        head = (f"\n## {datetime.date.today()}: {args.label or 'cli_startup'}\n\nCPU: {cpu_model()}; "
                f"Python {platform.python_version()}; `python bench/cli_startup.py --repeat {args.repeat}`\n\n")
        with open(args.record, "a") as out:
            out.write(head + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
