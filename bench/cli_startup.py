"""How long the command line takes to answer before it does any work: `byzantium --help`, a command's
--help, a refused flag and `byzantium plan`, each in a fresh interpreter (median wall time of --repeat
runs), and which heavy modules it imported.

    python bench/cli_startup.py                       # this checkout
    python bench/cli_startup.py --tree /tmp/before    # another copy of the package (e.g. `git archive REV byzantium`)
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [["--help"], ["run", "rrmaj", "--help"], ["sweep", "--help"], ["plan", "--help"], ["demo", "--help"],
         ["serve", "--help"], ["run", "rrmaj", "--agnets", "5"], ["plan", "smollm2-135m"]]
HEAVY = ("torch", "fastapi", "transformers")
PROBE = ("import json, sys; from byzantium.cli import main; rc = main(sys.argv[1:]); "
         f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)")


def measure(tree, argv, repeat):
    walls = []
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tree, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), json.loads(done.stderr.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]),
                    help="the directory holding the byzantium package to time (default: this checkout)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"| command | median wall s ({args.repeat} runs) | heavy modules imported |\n|---|---|---|")
    for argv in CASES:
        wall, heavy = measure(args.tree, argv, args.repeat)
        print(f"| `byzantium {' '.join(argv)}` | {wall:.2f} | {', '.join(heavy) or 'none'} |", flush=True)


if __name__ == "__main__":
    main()
