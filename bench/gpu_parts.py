"""The GPU check in parts, ordered by value, each under its own hard stop, that fit the time a device is lent.

    bash bench/gpu_check.sh --budget 600          # run the parts that fit in 600 s, in order of value
    bash bench/gpu_check.sh --part 1 --part 3     # run those parts
    bash bench/gpu_check.sh --budget 600 --plan   # say which parts would run, run nothing
    bash bench/gpu_check.sh --smoke               # the CPU variant of every part: checks the script here

Each part writes its log ($OUT/gpu_part<N>.log), its JSON ($OUT/gpu_part<N>.json: status, seconds, the
command and the log's tail) and one verdict line ($OUT/gpu_verdicts.txt) the moment it ends, so a part
cut off by the device's limit still leaves the earlier ones. Nothing is installed and nothing reaches the
network; pytest must be there (it says so at once when it is not). $OUT defaults to bench/results.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

PY = sys.executable
PYTEST = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
COLLECT = ["--collect-only", "-q"]  # the CPU variant of a test part: the files and selections exist
GPU_ISSUE_33 = ["tests/test_tensor_parallel.py", "tests/test_fp8.py", "tests/test_llama4.py"]

# (number, name, hard stop in seconds, command on the GPU, command for --smoke on the CPU)
PARTS = [
    (1, "Triton kernels vs the torch reference (fp32, fp16, bf16; MoE, windows)", 240,
     PYTEST + ["tests/test_kernels.py", "tests/test_window_attention.py", "tests/test_moe.py"],
     PYTEST + COLLECT + ["tests/test_kernels.py", "tests/test_window_attention.py", "tests/test_moe.py"]),
    (2, "engine greedy parity and decode throughput vs transformers, attention microbenchmarks", 240,
     [PY, "bench/gpu_check.py", "--skip-tests", "--out", "{out}"],
     [PY, "bench/gpu_check.py", "--smoke", "--skip-tests", "--out", "{out}"]),
    (3, "batch invariance (alone vs in a batch of 64), per-engine activation memory, MoE decode graphs", 150,
     [PY, "bench/batch_invariance.py", "--out", "{out}"],
     [PY, "bench/batch_invariance.py", "--smoke", "--out", "{out}"]),
    (4, "CUDA graphs, device sampling, speculation: their tests on CUDA", 200,
     PYTEST + ["tests/test_cuda_step.py", "tests/test_device_sampling.py", "tests/test_speculation.py"],
     PYTEST + COLLECT + ["tests/test_cuda_step.py", "tests/test_device_sampling.py", "tests/test_speculation.py"]),
    (5, "CUDA step bench: eager vs graphs decode, prefill TFLOP/s, host syncs, two models on one GPU", 240,
     [PY, "bench/cuda_step.py", "--out", "{out}"],
     [PY, "bench/cuda_step.py", "--smoke", "--out", "{out}"]),
    (6, "parity of the newer architectures on CUDA (Qwen3-MoE, Gemma 3, Mistral 3)", 240,
     PYTEST + ["tests/test_moe.py", "tests/test_gemma3.py", "tests/test_mistral3.py"],
     PYTEST + COLLECT + ["tests/test_moe.py", "tests/test_gemma3.py", "tests/test_mistral3.py"]),
    (7, "tensor parallelism on NCCL (needs two GPUs: says so and skips on one), FP8 linears and Llama 4 on CUDA",
     240, PYTEST + ["-rs"] + GPU_ISSUE_33 + ["-k", "cuda or gpus"],
     PYTEST + COLLECT + GPU_ISSUE_33 + ["-k", "cuda or gpus"]),
    (8, "FP8 linear (torch._scaled_mm) vs bf16 F.linear at 70B shapes: error and time", 120,
     [PY, "bench/fp8_check.py"],
     [PY, "bench/fp8_check.py", "--device", "cpu", "--shapes", "256x512", "--batches", "1,4"]),
]
KILL_AFTER_S = 10  # a part that ignores the interrupt is killed this long after its stop


def plan(budget, wanted=None):
    """The parts to run, in order of value: those asked for, else each that still fits the budget."""
    chosen, left = [], budget
    for part in PARTS:
        number, _, limit = part[:3]
        if wanted is not None:
            if number in wanted:
                chosen.append(part)
        elif left is None or limit + KILL_AFTER_S <= left:
            chosen.append(part)
            left = None if left is None else left - limit - KILL_AFTER_S
    return chosen


def run_part(part, out, smoke):
    number, name, limit, command, smoke_command = part
    argv = [a.replace("{out}", out) for a in (smoke_command if smoke else command)]
    log_path = os.path.join(out, f"gpu_part{number}.log")
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.send_signal(2)  # SIGINT: pytest and the benches write what they have
            try:
                proc.wait(timeout=KILL_AFTER_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            code = None
    seconds = round(time.monotonic() - start, 1)
    status = "timeout" if code is None else "pass" if code == 0 else "fail"
    with open(log_path, errors="replace") as f:
        tail = f.read()[-3000:]
    record = {"part": number, "name": name, "status": status, "exit_code": code, "seconds": seconds,
              "limit_s": limit, "smoke": smoke, "command": argv, "log": log_path, "log_tail": tail}
    with open(os.path.join(out, f"gpu_part{number}.json"), "w") as f:
        json.dump(record, f, indent=1)
    verdict = f"part {number} {status.upper()} in {seconds:.0f} s (stop {limit} s){' [smoke]' if smoke else ''}: {name}"
    with open(os.path.join(out, "gpu_verdicts.txt"), "a") as f:
        f.write(time.strftime("%Y-%m-%d %H:%M ") + verdict + "\n")
    print(verdict, flush=True)
    if status != "pass":
        print("\n".join(tail.splitlines()[-25:]), flush=True)
    return status == "pass"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=None, help="seconds the parts may take in all (default: all parts)")
    ap.add_argument("--part", type=int, action="append", choices=[p[0] for p in PARTS], help="run this part (repeatable)")
    ap.add_argument("--plan", action="store_true", help="say which parts would run, and run none")
    ap.add_argument("--smoke", action="store_true", help="the CPU variant of each part: checks the script")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    args = ap.parse_args()
    if args.budget is not None and args.budget <= 0:
        ap.error(f"--budget must be positive, got {args.budget}")
    chosen = plan(args.budget, set(args.part) if args.part else None)
    total = sum(p[2] + KILL_AFTER_S for p in chosen)
    skipped = [p[0] for p in PARTS if p not in chosen]
    print(f"gpu check plan: parts {[p[0] for p in chosen]} (at most {total} s)"
          + (f" within a budget of {args.budget:.0f} s" if args.budget is not None else "")
          + (f"; left out: {skipped}" if skipped else ""))
    for number, name, limit, _, _ in chosen:
        print(f"  part {number} ({limit} s): {name}")
    if args.plan:
        return 0
    if importlib.util.find_spec("pytest") is None:
        sys.exit("gpu check: parts 1, 4 and 6 need pytest, which this Python lacks (pip install pytest); "
                 "run the others with --part 2 --part 3 --part 5")
    if not args.smoke:
        import torch
        if not torch.cuda.is_available():
            sys.exit("gpu check: torch sees no CUDA device (--smoke runs the CPU variant of every part)")
    os.makedirs(args.out, exist_ok=True)
    results = [run_part(part, args.out, args.smoke) for part in chosen]
    print(f"gpu check: {sum(results)} of {len(results)} parts passed; verdicts in {os.path.join(args.out, 'gpu_verdicts.txt')}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
