"""Soak: does a server's resident memory stay flat after start-up? (issue 45: the KV pool was reserved
lazily, so a server's RSS climbed for thousands of requests and looked like a leak.)

Starts `byzantium serve` (a separate process, on loopback, the embedded model unless --model) and sends
--requests mixed chat requests from --clients threads with the official `openai` client, in a fixed
rotation: plain, a repeated prompt (prefix-cache hits), a JSON schema, n=2, streamed, and dropped (a
stream closed after its first chunk, so the server aborts it). The server's RSS (/proc/PID/status) is
sampled every --sample-every requests. Start-up is the server's RSS once its first --warm-up requests
have run (one of each kind: Python, Triton and the grammar engine have loaded what they load once); the
report gives the RSS after it, the largest and the last, and the growth from start-up in percent. The
script stops by itself after the last request (and --max-seconds at most), then stops the server.

    nice python bench/soak.py --requests 1000 [--clients 8] [--record --note "..."]

--record appends a dated entry (machine, command, samples, verdict) to bench/results/soak.md.
"""
import argparse
import datetime
import platform
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "soak.md"
KINDS = ("plain", "repeated", "schema", "n2", "streamed", "dropped")
TOPICS = ["why the sky is blue", "how a bicycle stays upright", "what a prime number is", "how bread rises",
          "why leaves change colour", "how a compass works", "what causes tides", "why ice floats"]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40},
                                           "confidence": {"type": "integer", "minimum": 0, "maximum": 10}},
          "required": ["answer", "confidence"]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def start_server(args, port):
    command = [sys.executable, "-c", "from byzantium.cli import main; main()", "serve", "--model", args.model,
               "--port", str(port), "--device", "cpu"] + (["--kv-cache-memory", args.kv_cache_memory]
                                                          if args.kv_cache_memory else [])
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
    return server, command, lines


def one(client, args, i):
    """Request i of the rotation; returns its kind."""
    kind = KINDS[i % len(KINDS)]
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
    return kind


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--warm-up", type=int, default=2 * len(KINDS), help="requests before start-up is measured")
    ap.add_argument("--sample-every", type=int, default=50)
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--start-timeout", type=float, default=180)
    ap.add_argument("--kv-cache-memory", default=None, help="passed to serve (default: serve's own)")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    if args.requests <= args.warm_up:
        raise SystemExit(f"--requests must be more than --warm-up ({args.warm_up})")
    import openai

    port = free_port()
    server, command, printed = start_server(args, port)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
    samples, failures, done = [(0, 0.0, rss_bytes(server.pid))], [], 0
    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(args.clients) as pool:
            for i in range(args.warm_up):
                one(client, args, i)
            done = args.warm_up
            samples.append((done, time.perf_counter() - started, rss_bytes(server.pid)))
            futures = iter([pool.submit(one, client, args, i) for i in range(args.warm_up, args.requests)])
            for future in futures:
                try:
                    future.result(timeout=max(1.0, args.max_seconds - (time.perf_counter() - started)))
                except Exception as error:  # noqa: BLE001 - counted and reported; the soak goes on
                    failures.append(repr(error)[:200])
                done += 1
                if done % args.sample_every == 0 or done == args.requests:
                    samples.append((done, time.perf_counter() - started, rss_bytes(server.pid)))
                if time.perf_counter() - started > args.max_seconds:
                    print(f"--max-seconds reached after {done} requests; stopping", flush=True)
                    for rest in futures:
                        rest.cancel()
                    break
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    report(args, command, printed, samples, failures, done, time.perf_counter() - started)


def report(args, command, printed, samples, failures, done, seconds):
    base = samples[1][2]  # after the warm-up: start-up done
    after = [rss for _, _, rss in samples[1:]]
    growth = (max(after) - base) / base * 100
    last = (after[-1] - base) / base * 100
    lines = ["| requests | seconds | RSS MiB |", "|---:|---:|---:|"]
    lines += [f"| {n} | {t:.0f} | {rss / 2**20:.0f} |" for n, t, rss in samples]
    kv = [line.strip() for line in printed if "KV cache" in line]
    summary = (f"{done} requests in {seconds:.0f} s, {len(failures)} failed; RSS after start-up "
               f"{base / 2**20:.0f} MiB, largest {max(after) / 2**20:.0f} MiB (+{growth:.1f} %), last "
               f"{after[-1] / 2**20:.0f} MiB ({last:+.1f} %)")
    print("\n".join(kv + lines + [summary] + failures[:5]), flush=True)
    if args.record:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   platform.processor())
        entry = [f"\n## {datetime.date.today().isoformat()}: {args.requests} requests, {args.clients} clients, "
                 f"max_tokens {args.max_tokens}", "",
                 f"Machine: {cpu}, Python {platform.python_version()}. Command: `{shlex.join(sys.argv)}`; "
                 f"server: `{shlex.join(['byzantium'] + command[3:])}`.", ""]
        entry += [f"Server at start: `{line}`" for line in kv] + [""] + lines + ["", summary + "."]
        if args.note:
            entry += ["", args.note]
        with RESULTS.open("a") as f:
            f.write("\n".join(entry) + "\n")


if __name__ == "__main__":
    main()
