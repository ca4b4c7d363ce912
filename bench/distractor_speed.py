"""Time `distractor` (the injection's target, verified wrong by the checker) over the shared benchmark files.

    python bench/distractor_speed.py [--data ../shared/data] [--seeds 3]

Per dataset: tasks, mean / median / worst milliseconds per call, calls over 1 ms, peak memory of one
call. The first seed's pass includes sympy's one-time import and is reported apart ("cold").
"""
import argparse
import json
import platform
import statistics
import time
import tracemalloc
from pathlib import Path

from byzantium.protocols.attacks import distractor
from byzantium.tasks import load_task

FILES = ["gsm8k.jsonl", "math500.jsonl", "aqua.jsonl", "arc_challenge.jsonl", "boolq.jsonl", "openbookqa.jsonl",
         "rte.jsonl", "bbh_logical_deduction_seven_objects.jsonl", "bbh_tracking_shuffled_objects_seven_objects.jsonl"]


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name in FILES:
        path = Path(args.data) / name
        if not path.is_file():
            continue
        tasks = load_task(str(path))
        cold = time.perf_counter()
        for t in tasks:
            distractor(t, 0)
        cold = (time.perf_counter() - cold) / len(tasks)
        times = []
        for seed in range(1, args.seeds + 1):
            for t in tasks:
                t0 = time.perf_counter()
                distractor(t, seed)
                times.append(time.perf_counter() - t0)
        tracemalloc.start()
        for t in tasks[:50]:
            distractor(t, 99)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rows.append(dict(dataset=name.removesuffix(".jsonl"), tasks=len(tasks), cold_mean_ms=1e3 * cold,
                         mean_ms=1e3 * statistics.mean(times), median_ms=1e3 * statistics.median(times),
                         worst_ms=1e3 * max(times), over_1ms=sum(x > 1e-3 for x in times), calls=len(times),
                         peak_kib=peak / 1024))
    print(f"CPU: {cpu_model()}")
    print("| dataset | tasks | cold mean ms | mean ms | median ms | worst ms | calls > 1 ms | peak KiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dataset']} | {r['tasks']} | {r['cold_mean_ms']:.3f} | {r['mean_ms']:.3f} | {r['median_ms']:.3f} | "
              f"{r['worst_ms']:.1f} | {r['over_1ms']} of {r['calls']} | {r['peak_kib']:.0f} |")
    print(json.dumps({"cpu": cpu_model(), "rows": rows}))


if __name__ == "__main__":
    main()
