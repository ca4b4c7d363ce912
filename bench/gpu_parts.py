"""The GPU check in parts, ordered by value, each under its own hard stop, that fit the time a device is lent.

    bash bench/gpu_check.sh                       # the default plan: parts 1-6, at most 390 s of stops
    bash bench/gpu_check.sh --budget 600          # the parts that fit in 600 s, in order of value
    bash bench/gpu_check.sh --part 1 --part 3     # those parts
    bash bench/gpu_check.sh --plan                # say which parts would run, run nothing
    bash bench/gpu_check.sh --smoke               # the CPU variant of every part: checks the script here

A device is lent once, for 15 minutes with its start; a run brings back at most 8 files. So the default
plan's stops add up to 6.5 minutes (two runs and a ~2-minute start fit), and everything lands in two
files of $OUT, written the moment each part ends so that a run cut off keeps the parts before it:
gpu_check.json (the bundle: one record per part with its status, seconds, command, log tail and whatever
JSON or markdown it wrote) and gpu_check.log (every part's full output). Nothing is built or installed
(BYZANTIUM_CPU_KERNELS=off: no C++ CPU-kernel build) and nothing reaches the network. $OUT defaults to
bench/results.
"""
import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

PY = sys.executable
PYTEST = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
COLLECT = ["--collect-only"]  # the CPU variant of a test part: the files and selections exist
TRITON_TESTS = ["tests/test_kernels.py", "tests/test_window_attention.py", "tests/test_moe.py", "tests/test_fp8.py",
                "tests/test_fp8_experts.py", "-k", "TestTriton"]
GRAPH_TESTS = ["tests/test_cuda_step.py", "tests/test_device_sampling.py",
               "tests/test_engine_memory.py::test_cuda_planning_holds_the_warm_up_graph_pool"]
CUDA_MODEL_TESTS = ["tests/test_llama4.py", "tests/test_cuda_parity.py", "tests/test_fp8.py", "-k", "cuda"]
TP_TESTS = ["tests/test_tensor_parallel.py", "-k", "gpus"]

# (number, name, hard stop in seconds, command on the GPU, command for --smoke on the CPU); "{out}" is the
# part's own scratch directory, whose files are folded into the bundle
PARTS = [
    (1, "Triton kernels vs the torch reference: fp32/fp16/bf16, windows and chunks, FP8 KV, MoE, FP8 MoE", 100,
     PYTEST + TRITON_TESTS, PYTEST + COLLECT + TRITON_TESTS),
    (2, "engine greedy parity and decode throughput vs transformers (random Qwen3-0.6B shape), attention kernels", 80,
     [PY, "bench/gpu_check.py", "--skip-tests", "--out", "{out}"],
     [PY, "bench/gpu_check.py", "--smoke", "--skip-tests", "--out", "{out}"]),
    (3, "CUDA graphs vs eager decode, device sampling, the graph pool in memory planning: their tests on CUDA", 50,
     PYTEST + GRAPH_TESTS, PYTEST + COLLECT + GRAPH_TESTS),
    (4, "FP8 linear (torch._scaled_mm) vs bf16 F.linear at 70B shapes: error and time", 30,
     [PY, "bench/fp8_check.py", "--iters", "10", "--out", "{out}"],
     [PY, "bench/fp8_check.py", "--device", "cpu", "--shapes", "256x512", "--batches", "1,4", "--iters", "2",
      "--out", "{out}"]),
    (5, "Llama 4, Qwen3-MoE, Gemma 3, Mistral 3 on CUDA vs transformers; the FP8 _scaled_mm path", 60,
     PYTEST + CUDA_MODEL_TESTS, PYTEST + COLLECT + CUDA_MODEL_TESTS),
    (6, "batch drift: a request alone vs in a batch of 64 (logit drift, where greedy tokens part), pool memory",
     40, [PY, "bench/batch_invariance.py", "--out", "{out}"], [PY, "bench/batch_invariance.py", "--smoke", "--out", "{out}"]),
    (7, "CUDA step bench: eager vs graphs decode, prefill TFLOP/s, host syncs", 90,
     [PY, "bench/cuda_step.py", "--skip-memory", "--out", "{out}"], [PY, "bench/cuda_step.py", "--smoke", "--out", "{out}"]),
    (8, "tensor parallelism on NCCL (needs two GPUs: says so and skips on one)", 120,
     PYTEST + TP_TESTS, PYTEST + COLLECT + TP_TESTS),
]
KILL_AFTER_S = 5  # a part that ignores the interrupt is killed this long after its stop
DEFAULT_BUDGET_S = 390  # parts 1-6; twice this and a machine start fit in the 15 minutes lent
BUNDLE, LOG = "gpu_check.json", "gpu_check.log"
TAIL_CHARS = 4000


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


def machine():
    """What ran the check: versions and the device, without importing torch into this process's memory twice."""
    probe = ("import json, platform, torch\n"
             "info = {'python': platform.python_version(), 'torch': torch.__version__}\n"
             "try:\n import triton; info['triton'] = triton.__version__\nexcept ImportError: info['triton'] = None\n"
             "try:\n import transformers; info['transformers'] = transformers.__version__\n"
             "except ImportError: info['transformers'] = None\n"
             "if torch.cuda.is_available():\n"
             " info['gpu'] = torch.cuda.get_device_name(); info['capability'] = list(torch.cuda.get_device_capability())\n"
             "print(json.dumps(info))\n")
    try:
        run = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=60)
        return json.loads(run.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as error:
        return {"python": platform.python_version(), "probe_error": repr(error)}


def write_bundle(out, bundle):
    """Rewrite the bundle whole (a temporary file renamed over it): a part cut off never leaves it half written."""
    path = os.path.join(out, BUNDLE)
    with open(path + ".tmp", "w") as f:
        json.dump(bundle, f, indent=1)
    os.replace(path + ".tmp", path)


def outputs_of(directory):
    """What a part wrote to its scratch directory: JSON parsed, text as text."""
    found = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        with open(path, errors="replace") as f:
            text = f.read()
        try:
            found[name] = json.loads(text) if name.endswith(".json") else text[-20000:]
        except ValueError:
            found[name] = text[-20000:]
    return found


def run_part(part, out, smoke, bundle=None):
    """Run one part under its stop; append its record to the bundle and its output to the log as it ends."""
    number, name, limit, command, smoke_command = part
    scratch = tempfile.mkdtemp(prefix=f"gpu_part{number}_")
    argv = [a.replace("{out}", scratch) for a in (smoke_command if smoke else command)]
    start = time.monotonic()
    with tempfile.TemporaryFile("w+", errors="replace") as log:
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
        log.seek(0)
        text = log.read()
    seconds = round(time.monotonic() - start, 1)
    status = "timeout" if code is None else "pass" if code == 0 else "fail"
    record = {"part": number, "name": name, "status": status, "exit_code": code, "seconds": seconds,
              "limit_s": limit, "smoke": smoke, "command": argv, "log_tail": text[-TAIL_CHARS:],
              "outputs": outputs_of(scratch)}
    shutil.rmtree(scratch, ignore_errors=True)
    with open(os.path.join(out, LOG), "a") as f:
        f.write(f"\n===== part {number}: {name} ({status}, {seconds} s) =====\n$ {' '.join(argv)}\n{text}")
    if bundle is None:
        path = os.path.join(out, BUNDLE)
        bundle = json.load(open(path)) if os.path.exists(path) else {"parts": []}
    bundle["parts"].append(record)
    write_bundle(out, bundle)
    verdict = f"part {number} {status.upper()} in {seconds:.0f} s (stop {limit} s){' [smoke]' if smoke else ''}: {name}"
    print(verdict, flush=True)
    if status != "pass":
        print("\n".join(text.splitlines()[-25:]), flush=True)
    return status == "pass"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=None,
                    help=f"seconds the parts' stops may add up to (default {DEFAULT_BUDGET_S}; --part overrides)")
    ap.add_argument("--part", type=int, action="append", choices=[p[0] for p in PARTS], help="run this part (repeatable)")
    ap.add_argument("--plan", action="store_true", help="say which parts would run, and run none")
    ap.add_argument("--smoke", action="store_true", help="the CPU variant of each part: checks the script")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    args = ap.parse_args()
    if args.budget is not None and args.budget <= 0:
        ap.error(f"--budget must be positive, got {args.budget}")
    budget = DEFAULT_BUDGET_S if args.budget is None and not args.part else args.budget
    chosen = plan(budget, set(args.part) if args.part else None)
    total = sum(p[2] + KILL_AFTER_S for p in chosen)
    skipped = [p[0] for p in PARTS if p not in chosen]
    print(f"gpu check plan: parts {[p[0] for p in chosen]} (at most {total} s)"
          + (f" within a budget of {budget:.0f} s" if budget is not None else "")
          + (f"; left out: {skipped}" if skipped else ""))
    for number, name, limit, _, _ in chosen:
        print(f"  part {number} ({limit} s): {name}")
    if args.plan:
        return 0
    if importlib.util.find_spec("pytest") is None:
        sys.exit("gpu check: parts 1, 3, 5 and 8 need pytest, which this Python lacks; carry it in the tree "
                 "(PYTHONPATH) or run the others with --part 2 --part 4 --part 6")
    if not args.smoke:
        import torch
        if not torch.cuda.is_available():
            sys.exit("gpu check: torch sees no CUDA device (--smoke runs the CPU variant of every part)")
    os.makedirs(args.out, exist_ok=True)
    bundle = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "smoke": args.smoke, "machine": machine(),
              "plan": [p[0] for p in chosen], "parts": []}
    write_bundle(args.out, bundle)
    results = [run_part(part, args.out, args.smoke, bundle) for part in chosen]
    print(f"gpu check: {sum(results)} of {len(results)} parts passed; all in {os.path.join(args.out, BUNDLE)}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
