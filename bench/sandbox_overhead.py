"""What the code sandbox costs a call: run_code("pass") and one HumanEval check of a right solution.

    python bench/sandbox_overhead.py [--calls 20] [--label NAME]

Prints one markdown row (ms a call, mean and median over --calls calls after one warm-up) with the
CPU it ran on. To compare two versions, run it once per checkout on a quiet machine
(PYTHONPATH=OTHER_CHECKOUT python bench/sandbox_overhead.py --label before).
"""
import argparse
import platform
import statistics
import time

from byzantium.tasks.humaneval import check_humaneval
from byzantium.tasks.sandbox import run_code

PROBLEM = {"prompt": "def double(x: int) -> int:\n    \"\"\"Return 2 * x.\"\"\"\n", "entry_point": "double",
           "test": "def check(candidate):\n    assert candidate(3) == 6\n    assert candidate(-1) == -2\n"}


def cpu():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def timed(fn, calls):
    fn()  # warm-up: imports, page cache
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        result = fn()
        times.append(1000 * (time.perf_counter() - start))
        assert result.passed, result.stderr
    return statistics.mean(times), statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--label", default="this checkout")
    args = ap.parse_args()
    run = timed(lambda: run_code("pass"), args.calls)
    check = timed(lambda: check_humaneval(PROBLEM, "    return 2 * x\n"), args.calls)
    print(f"| {args.label} | {run[0]:.1f} / {run[1]:.1f} | {check[0]:.1f} / {check[1]:.1f} | {cpu()} |")


if __name__ == "__main__":
    main()
