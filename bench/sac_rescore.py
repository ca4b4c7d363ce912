"""What re-scoring every round costs SAC: the paper's rescore="always" against the "changed" shortcut
(only a changed answer is re-scored), on the embedded model. Counts the judge calls per run and times it.

    python bench/sac_rescore.py [--problems 4] [--rounds 3] [--modes logprob generate]

Both settings run the same problems with the same seeds, one after the other, on one engine; the order
alternates between modes so a warm-up falls on each setting once. Appends a dated entry to
bench/results/sac_rescore.md.
"""
import argparse
import asyncio
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from byzantium.backends import load_llm
from byzantium.engine.loader import resolve_model
from byzantium.engine.sampling import SamplingParams
from byzantium.protocols.byzantine import make_agents
from byzantium.protocols.graphs import merg
from byzantium.protocols.sac import run_sac
from byzantium.tasks import get_task

OUT = Path(__file__).parent / "results" / "sac_rescore.md"
HEADING = ("# SAC: re-scoring every round (the paper's) vs only a changed answer\n\n"
           "Command: `python bench/sac_rescore.py`. Judge calls counted at the backend (tag `score`).\n")


class Counting:
    """Passes every call to `llm` and counts the judge calls (chat or score tagged "score")."""

    def __init__(self, llm):
        self.llm, self.judges, self.name = llm, 0, getattr(llm, "name", None)

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        self.judges += tag == "score"
        return await self.llm.chat(messages, params, tag=tag)

    async def score(self, messages, candidates, untrusted=False, tag=None):
        self.judges += tag == "score"
        return await self.llm.score(messages, candidates, tag=tag)


def run(llm, tasks, cache, mode, rescore, rounds, solve, judge):
    counting = Counting(llm)

    async def main():
        runs = [run_sac(t, merg(7), make_agents(counting, counting, 7, 2, 1, t, cache, seed=0), F=3, T=rounds,
                        score_mode=mode, solve_params=solve, judge_params=judge, rescore=rescore) for t in tasks]
        return await asyncio.gather(*runs)

    start = time.perf_counter()
    records = asyncio.run(main())
    wall = time.perf_counter() - start
    unchanged = sum(a["answer"] == a["previous"] for r in records for rnd in r["rounds"][1:]
                    for a in rnd["agents"] if "previous" in a)
    updates = sum(1 for r in records for rnd in r["rounds"][1:] for a in rnd["agents"] if "previous" in a)
    return counting.judges, wall, unchanged, updates


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["logprob", "generate"], choices=("logprob", "generate"))
    args = ap.parse_args()
    llm = load_llm(resolve_model("smollm2-135m"), backend="native", num_blocks=2048)
    tasks = get_task("gen-arith", args.problems, seed=0)
    cache = [(t.id, t.gold) for t in get_task("gen-arith", 20, seed=1)]
    solve, judge = SamplingParams(max_tokens=64, temperature=0.1), SamplingParams(max_tokens=32, temperature=0.1)
    rows = []
    for k, mode in enumerate(args.modes):
        order = ("always", "changed") if k % 2 else ("changed", "always")
        got = {rescore: run(llm, tasks, cache, mode, rescore, args.rounds, solve, judge) for rescore in order}
        (ja, wa, ua, na), (jc, wc, _, _) = got["always"], got["changed"]
        rows.append(f"| {mode} | {order[0]} | {ja} | {jc} | {(ja - jc) / ja:.1%} | {wa:.1f} s | {wc:.1f} s | "
                    f"{(wa - wc) / wa:.1%} | {ua}/{na} |")
        print(rows[-1])
    llm.close()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    append_entry([
        f"\n## {datetime.date.today().isoformat()}: {args.problems} gen-arith problems, n=7 MERG (4 strong, 2 weak, "
        f"1 fixed adversary, all smollm2-135m), F=3, T={args.rounds}, temperature 0.1, solve/refine <= 64 tokens, "
        "judge <= 32 (generate)\n",
        f"Command: `python bench/sac_rescore.py {' '.join(sys.argv[1:])}`. CPU: {cpu}; {platform.platform()}; "
        f"load average {os.getloadavg()[0]:.1f} at the end (2 cores shared with other jobs, so times are noisy).\n",
        "| scoring | ran first | judge calls, always | judge calls, changed | saved | wall, always | wall, changed |"
        " saved | honest updates that kept the answer |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ])


def append_entry(lines):
    if not OUT.exists():
        OUT.write_text(HEADING)
    with OUT.open("a") as f:
        f.write("\n".join(lines) + "\n")
    print(f"appended to {OUT}")


if __name__ == "__main__":
    main()
