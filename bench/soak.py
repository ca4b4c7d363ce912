"""Soak: does a server's resident memory stay flat after start-up, and does nothing else grow? (issue 45:
the KV pool was reserved lazily, so a server's RSS climbed for thousands of requests and looked like a leak.)

Starts `byzantium serve` (a separate process, on loopback, the embedded model unless --model) and sends
--requests mixed chat requests from --clients threads with the official `openai` client, in a fixed
rotation: plain, a repeated prompt (prefix-cache hits), a JSON schema, n=2, streamed, and dropped (a
stream closed after its first chunk, so the server aborts it). Every --sample-every requests it records
the server's RSS, open file descriptors and threads (from /proc), and what a probe thread inside the
server last counted: Python objects the garbage collector tracks and blocks Python's allocator holds.
Start-up is the server once its first --warm-up requests have run (one of each kind at least: Python,
Triton and the grammar engine have loaded what they load once); the report gives RSS at start, after
start-up, the largest and the last, the growth from start-up in percent, each kind's count, and the
server's own count of finished requests by reason (/metrics). The script stops by itself after the last
request (and --max-seconds at most), then stops the server.

    nice python bench/soak.py --requests 3000 --clients 16 --max-tokens 8 [--record --note "..."]

--record appends a dated entry (machine, command, samples, verdict) to bench/results/soak.md.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "soak.md"
KINDS = ("plain", "repeated", "schema", "n2", "streamed", "dropped")
TOPICS = ["why the sky is blue", "how a bicycle stays upright", "what a prime number is", "how bread rises",
          "why leaves change colour", "how a compass works", "what causes tides", "why ice floats"]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40},
                                           "confidence": {"type": "integer", "minimum": 0, "maximum": 10}},
          "required": ["answer", "confidence"]}

# Run inside the server process before `byzantium serve`: a thread that appends, every few seconds, what
# only the process itself can count. It never collects garbage itself, so it does not change what it watches.
PROBE = """
import gc, json, sys, threading, time
def _soak_probe(path, every):
    while True:
        counts = dict(time=time.time(), objects=len(gc.get_objects()), blocks=sys.getallocatedblocks())
        with open(path, "a") as f:
            f.write(json.dumps(counts) + "\\n")
        time.sleep(every)
threading.Thread(target=_soak_probe, args=({path!r}, {every!r}), name="soak-probe", daemon=True).start()
from byzantium.cli import main
sys.exit(main())
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_status(pid):
    """RSS in bytes, threads and open file descriptors of a process, from /proc."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {"rss": int(status["VmRSS"].split()[0]) * 1024, "threads": int(status["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def last_probe(path):
    """The probe's latest line (Python objects, allocated blocks), or {} before its first."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return {}
    return json.loads(lines[-1]) if lines else {}


def start_server(args, port, probe_path):
    flags = ["serve", "--model", args.model, "--port", str(port), "--device", "cpu"]
    if args.kv_cache_memory:
        flags += ["--kv-cache-memory", args.kv_cache_memory]
    code = PROBE.format(path=probe_path, every=args.probe_seconds)
    server = subprocess.Popen([sys.executable, "-c", code] + flags, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    lines, deadline = [], time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the server exited at start:\n" + server.stdout.read())
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.5)
    else:
        server.kill()
        raise RuntimeError(f"the server did not answer /health within {args.start_timeout} s")
    # what it printed at start (the KV line among it); the rest of its output is drained in the background
    threading.Thread(target=lambda: [lines.append(line) for line in server.stdout], daemon=True).start()
    time.sleep(0.5)
    return server, flags, lines


def finished_by_reason(port):
    """The server's request_success_total by finished_reason, summed over models (/metrics)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    counts = Counter()
    for reason, value in re.findall(r'^byzantium:request_success_total\{[^}]*finished_reason="(\w+)"[^}]*\} (\S+)$',
                                    text, re.M):
        counts[reason] += int(float(value))
    return dict(counts)


def kind_of(i):
    return KINDS[i % len(KINDS)]


def one(client, args, i):
    """Request i of the rotation."""
    kind = kind_of(i)
    topic = TOPICS[(i // len(KINDS)) % len(TOPICS)]
    text = "Explain why the sky is blue." if kind == "repeated" else f"(Question {i}) In one sentence, {topic}?"
    kw = dict(model=args.model, messages=[{"role": "user", "content": text}], max_tokens=args.max_tokens,
              temperature=1.0, seed=i)
    if kind == "schema":
        kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    if kind == "n2":
        kw["n"] = 2
    if kind in ("streamed", "dropped"):
        stream = client.chat.completions.create(stream=True, **kw)
        for _ in stream:
            if kind == "dropped":
                break
        stream.close()
    else:
        client.chat.completions.create(**kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--warm-up", type=int, default=2 * len(KINDS), help="requests before start-up is measured")
    ap.add_argument("--sample-every", type=int, default=100)
    ap.add_argument("--probe-seconds", type=float, default=5.0, help="how often the in-server probe counts")
    ap.add_argument("--max-seconds", type=float, default=1500)
    ap.add_argument("--start-timeout", type=float, default=180)
    ap.add_argument("--kv-cache-memory", default=None, help="passed to serve (default: serve's own)")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    if args.warm_up < len(KINDS) or args.requests <= args.warm_up:
        raise SystemExit(f"need --requests > --warm-up >= {len(KINDS)} (one of each kind), got "
                         f"{args.requests} and {args.warm_up}")
    if args.clients < 1 or args.max_tokens < 1 or args.sample_every < 1 or args.probe_seconds <= 0:
        raise SystemExit("--clients, --max-tokens, --sample-every and --probe-seconds must be positive")
    import openai

    port = free_port()
    probe_path = os.path.join(tempfile.mkdtemp(prefix="soak-"), "probe.jsonl")
    server, flags, printed = start_server(args, port, probe_path)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
    started, load_at_start = time.perf_counter(), os.getloadavg()[0]

    def sample(done):
        return {"requests": done, "seconds": time.perf_counter() - started, **process_status(server.pid),
                **{k: v for k, v in last_probe(probe_path).items() if k != "time"}}

    samples, ok, failed, failures, done, reasons = [sample(0)], Counter(), Counter(), [], 0, {}
    try:
        for i in range(args.warm_up):
            one(client, args, i)
            ok[kind_of(i)] += 1
        done = args.warm_up
        time.sleep(args.probe_seconds + 1)  # the probe's next count is of the started server
        samples.append(sample(done))
        pool = ThreadPoolExecutor(args.clients)
        futures = iter([(i, pool.submit(one, client, args, i)) for i in range(args.warm_up, args.requests)])
        try:
            for i, future in futures:
                try:
                    future.result(timeout=max(1.0, args.max_seconds - (time.perf_counter() - started)))
                    ok[kind_of(i)] += 1
                except Exception as error:  # noqa: BLE001 - counted and reported; the soak goes on
                    failed[kind_of(i)] += 1
                    failures.append(f"request {i} ({kind_of(i)}): {error!r}"[:200])
                done += 1
                if done % args.sample_every == 0 or done == args.requests:
                    samples.append(sample(done))
                if time.perf_counter() - started > args.max_seconds:
                    print(f"--max-seconds reached after {done} requests; stopping", flush=True)
                    break
        finally:  # those still running end when the server stops
            pool.shutdown(wait=False, cancel_futures=True)
        time.sleep(args.probe_seconds + 1)  # requests done: the server idle, counted once more
        samples.append(sample(done))
        reasons = finished_by_reason(port)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    load = f"load average (1 min) {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    report(args, flags, printed, samples, ok, failed, failures, reasons, time.perf_counter() - started, load)


def change(before, after):
    return f"{(after - before) / before * 100:+.1f} %"


def report(args, flags, printed, samples, ok, failed, failures, reasons, seconds, load):
    base, last = samples[1], samples[-1]  # samples[1]: after the warm-up, start-up done
    largest = max(s["rss"] for s in samples[1:])
    mib = 2 ** 20
    probed = "objects" in base
    head = "| requests | seconds | RSS MiB | fds | threads |" + (" Python objects | allocated blocks |" if probed else "")
    lines = [head, "|" + "---:|" * (head.count("|") - 1)]
    for s in samples:
        row = f"| {s['requests']} | {s['seconds']:.0f} | {s['rss'] / mib:.1f} | {s['fds']} | {s['threads']} |"
        if probed:
            row += f" {s.get('objects', '')} | {s.get('blocks', '')} |"
        lines.append(row)
    kv = [line.strip() for line in printed if "KV cache" in line]
    done = sum(ok.values()) + sum(failed.values())
    kinds = ", ".join(f"{kind} {ok[kind]}" + (f" (+{failed[kind]} failed)" if failed[kind] else "") for kind in KINDS)
    summary = [
        f"{done} requests in {seconds:.0f} s ({done / seconds:.1f}/s), {sum(failed.values())} failed: {kinds}.",
        f"Server's finished requests by reason (/metrics, engine requests: n=2 counts 2): "
        f"{', '.join(f'{k} {v}' for k, v in sorted(reasons.items())) or 'not read'}.",
        f"RSS at start {samples[0]['rss'] / mib:.1f} MiB, after start-up {base['rss'] / mib:.1f} MiB, largest "
        f"{largest / mib:.1f} MiB ({change(base['rss'], largest)}), last {last['rss'] / mib:.1f} MiB "
        f"({change(base['rss'], last['rss'])}).",
        f"After start-up -> last: fds {base['fds']} -> {last['fds']}, threads {base['threads']} -> {last['threads']}"
        + (f", Python objects {base['objects']} -> {last['objects']} ({change(base['objects'], last['objects'])}), "
           f"allocated blocks {base['blocks']} -> {last['blocks']} ({change(base['blocks'], last['blocks'])})"
           if probed and "objects" in last else "") + "."]
    print("\n".join(kv + lines + summary + failures[:5]), flush=True)
    if args.record:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   platform.processor())
        entry = [f"\n## {datetime.date.today().isoformat()}: {args.requests} requests, {args.clients} clients, "
                 f"max_tokens {args.max_tokens}", "",
                 f"Machine: {cpu}, {os.cpu_count()} cores ({load}), Python {platform.python_version()}. Command: "
                 f"`{shlex.join(['python'] + sys.argv)}`; server: `{shlex.join(['byzantium'] + flags)}`.", ""]
        entry += [f"Server at start: `{line}`" for line in kv] + [""] + lines + [""] + summary
        if failures:
            entry += ["", "Failures (first 5): " + "; ".join(f"`{f}`" for f in failures[:5])]
        if args.note:
            entry += ["", args.note]
        with RESULTS.open("a") as f:
            f.write("\n".join(entry) + "\n")


if __name__ == "__main__":
    main()
