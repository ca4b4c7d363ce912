"""Where the wall time of a protocol run goes: the model's forward passes, the engine's own host work
inside a step (scheduling, step metadata, sampling, bookkeeping), and everything outside the steps
(asyncio hand-offs, the protocol, detokenisation, waiting for the next step to be formed).

Runs the RRMaj workload of bench/rr_workload.py and one SAC round of bench/sac_round.py's shape on the
native backend, in-process, with the forward pass and the sampler timed by wrapping them (nothing else
changes), and prints/appends one table per workload.

    python bench/host_overhead.py [--questions 8] [--record]
"""
import argparse
import asyncio
import datetime
import platform
import subprocess
import time
from pathlib import Path

import torch

from byzantium.backends import load_llm
from byzantium.engine import engine as engine_module
from byzantium.kernels.linear_choice import cpu_name
from byzantium.protocols.attacks import make_agents
from byzantium.protocols.round_robin import rr_majority
from byzantium.tasks import get_task

RESULTS = Path(__file__).parent / "results" / "host_overhead.md"


class Timers:
    """Seconds spent in the wrapped callables, by name."""

    def __init__(self):
        self.seconds = {}

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        return timed


def instrument(llm, timers):
    """Time the engine's steps, its forward passes and its sampler (the same objects, wrapped)."""
    engine = llm.engine.engine
    engine.step = timers.wrap("step", engine.step)
    engine.runner.run = timers.wrap("forward", engine.runner.run)
    engine_module.sample = timers.wrap("sampling", engine_module.sample)


def rrmaj(llm, questions):
    agents = make_agents(llm, 3, 5)
    tasks = get_task("gen-arith", questions, 0)

    async def run(tasks):
        return await asyncio.gather(*(rr_majority(t, agents, m=5, k=32, max_len=128, temperature=0.7) for t in tasks))
    return lambda n=None: asyncio.run(run(tasks[:n] if n else tasks))


def sac_round(llm, questions):
    from byzantium import SamplingParams
    from byzantium.protocols.byzantine import make_agents as sac_agents
    from byzantium.protocols.graphs import complete
    from byzantium.protocols.sac import run_sac
    tasks = get_task("gen-arith", questions, 0)
    cache = [(t.id, t.gold) for t in get_task("gen-arith", 20, seed=1)]  # the fixed adversary's wrong answers
    params = SamplingParams(max_tokens=64, temperature=0.1)

    async def run(tasks):
        return await asyncio.gather(*(run_sac(t, complete(5), sac_agents(llm, n=5, weak=0, byzantine=1, task=t,
                                                                        cache=cache, seed=0),
                                              1, 1, score_mode="logprob", solve_params=params, judge_params=params)
                                      for t in tasks))
    return lambda n=None: asyncio.run(run(tasks[:n] if n else tasks))


def measure(name, make, questions):
    llm = load_llm("smollm2-135m", backend="native", device="cpu")
    workload = make(llm, questions)
    workload(1)  # warm-up: kernel choices, first-touch, the CPU kernels' build
    timers = Timers()
    instrument(llm, timers)
    llm.reset_stats()
    start = time.perf_counter()
    workload()
    wall = time.perf_counter() - start
    stats = llm.stats
    llm.close()
    step, forward, sampling = (timers.seconds.get(k, 0.0) for k in ("step", "forward", "sampling"))
    parts = {"forward passes": forward, "sampling": sampling, "rest of the step (scheduling, metadata, bookkeeping)":
             step - forward - sampling, "outside the steps (asyncio, protocol, detokenisation)": wall - step}
    return {"workload": name, "wall": wall, "parts": parts, "steps": stats["steps"],
            "generated": stats["decode_tokens"], "prefill": stats["prefill_tokens"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--record", action="store_true", help=f"append the tables to {RESULTS}")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"\n## {datetime.date.today()}: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
             f"commit {commit}\n", f"`python bench/host_overhead.py --questions {args.questions}` (SmolLM2-135M fp32, "
             f"{platform.machine()})\n"]
    for name, make in (("RRMaj (N=5, 3c2t, M=5, K=32, L=128)", rrmaj), ("SAC round (n=5, logprob scoring)", sac_round)):
        r = measure(name, make, args.questions)
        lines += [f"\n{r['workload']}: {r['wall']:.2f} s wall, {r['steps']} steps, {r['prefill']} prefill + "
                  f"{r['generated']} decode tokens\n", "| where | seconds | share |", "|---|---|---|"]
        lines += [f"| {part} | {sec:.2f} | {100 * sec / r['wall']:.1f} % |" for part, sec in r["parts"].items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.record:
        if not RESULTS.exists():
            RESULTS.write_text("# Host overhead: where a protocol run's wall time goes\n")
        with RESULTS.open("a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
