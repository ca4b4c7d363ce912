"""Load on the OpenAI-compatible server: N concurrent clients, each sending R chat requests in a loop.

For each N it reports requests/s, generated tokens/s, request latency p50/p90/p99 and time to the first
token p50/p99. Every request streams (stream=True, with a usage chunk), so the time to the first token is
the arrival of the first chunk that carries text, and the generated tokens are the server's own count.
Prompts differ per client and request; sampling is seeded (--seed) at --temperature.

The server is either one already running (--url http://127.0.0.1:8000, e.g. `byzantium serve`) or,
by default, one this script starts in-process on --model/--device (build_app + ServerThread). In-process
the clients and the server share one Python process (and its GIL): on a small CPU the client side's
SSE parsing costs the server some time; a separate `byzantium serve` avoids that.

    python bench/serve_load.py [--clients 1,8,32,64] [--requests 4] [--max-tokens 64] [--record --note "..."]
    python bench/serve_load.py --url http://127.0.0.1:8000 --model smollm2-135m

--record appends a dated entry (machine, versions, command, table) to bench/results/serve_load.md.
"""
import argparse
import asyncio
import datetime
import os
import platform
import shlex
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "serve_load.md"
TOPICS = ["why the sky is blue", "how a bicycle stays upright", "what a prime number is", "how bread rises",
          "why leaves change colour", "how a compass works", "what causes tides", "how vaccines work",
          "why ice floats", "how a lighthouse warns ships", "what a black hole is", "how bees make honey",
          "why the sea is salty", "how a rainbow forms", "what photosynthesis does", "how a lock and key work"]


def prompt(client, request):
    topic = TOPICS[(client * 7 + request) % len(TOPICS)]
    return [{"role": "user", "content": f"(Reader {client}, question {request}) In a few sentences, explain {topic}."}]


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


async def one_request(client, args, c, r):
    start = time.perf_counter()
    first, tokens, text = None, None, []
    stream = await client.chat.completions.create(
        model=args.model, messages=prompt(c, r), max_tokens=args.max_tokens, temperature=args.temperature,
        seed=args.seed, stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter()
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    if tokens is None:  # a server without usage chunks: count text chunks instead
        tokens = len(text)
    return dict(latency=end - start, ttft=(first or end) - start, tokens=tokens)


async def run_level(base_url, args, n):
    import openai
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=args.api_key or "none", max_retries=0,
                                timeout=args.timeout)
    results, errors = [], []

    async def worker(c):
        for r in range(args.requests):
            try:
                results.append(await one_request(client, args, c, r))
            except Exception as error:  # noqa: BLE001 - counted and reported, the others go on
                errors.append(f"{type(error).__name__}: {str(error)[:120]}")

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in range(n)))
        wall = time.perf_counter() - start
    finally:
        await client.close()
    lat, ttft = [x["latency"] for x in results], [x["ttft"] for x in results]
    tokens = sum(x["tokens"] for x in results)
    return dict(clients=n, requests=len(results), errors=len(errors), first_error=errors[0] if errors else "",
                wall=wall, req_per_s=len(results) / wall, tok_per_s=tokens / wall, tokens=tokens,
                p50=percentile(lat, 50), p90=percentile(lat, 90), p99=percentile(lat, 99),
                ttft_p50=percentile(ttft, 50), ttft_p99=percentile(ttft, 99))


def table(rows, engine_stats):
    head = ["clients", "requests", "errors", "wall s", "req/s", "gen tok/s", "latency p50 / p90 / p99 s",
            "TTFT p50 / p99 s"]
    if engine_stats:
        head.append("max batch seqs")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["clients"], row["requests"], row["errors"], f"{row['wall']:.1f}", f"{row['req_per_s']:.2f}",
                 f"{row['tok_per_s']:.1f}", f"{row['p50']:.2f} / {row['p90']:.2f} / {row['p99']:.2f}",
                 f"{row['ttft_p50']:.2f} / {row['ttft_p99']:.2f}"]
        if engine_stats:
            cells.append(row.get("max_batch_seqs", ""))
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def machine(args):
    """What ran it: CPU model and cores (this machine), the GPU when the in-process server is on one."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = dict(cpu=cpu, cores=os.cpu_count(), platform=platform.platform(), python=platform.python_version())
    try:
        import torch
        info["torch"] = torch.__version__
        info["threads"] = torch.get_num_threads()
        if not args.url and str(args.device).startswith("cuda") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        info["torch"] = "not installed"
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        info["byzantium"] = head + (" (uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        info["byzantium"] = "unknown"
    return info


def _quote(arg):
    """A shell word for the recorded command line; double quotes where that is enough (readable notes)."""
    if arg == shlex.quote(arg) or any(c in arg for c in '"$`\\!'):
        return shlex.quote(arg)
    return f'"{arg}"'


def record(args, rows, info, server, engine_stats, load):
    now = datetime.datetime.now().astimezone()
    hardware = info.get("gpu") or f"{info['cpu']}, {info['cores']} cores"
    command = "python bench/serve_load.py " + " ".join(_quote(a) for a in sys.argv[1:])
    lines = [f"## {now:%Y-%m-%d %H:%M %Z}: {hardware}", "",
             f"- Command: `{command.strip()}`",
             f"- Server: {server}; model {args.model}; {args.requests} requests per client, max_tokens "
             f"{args.max_tokens}, temperature {args.temperature}, seed {args.seed}, streamed.",
             f"- Machine: {info['cpu']} ({info['cores']} cores{', GPU ' + info['gpu'] if 'gpu' in info else ''}), "
             f"{info['platform']}; load average {load[0]:.1f} before, {load[1]:.1f} after.",
             f"- Versions: byzantium {info['byzantium']}, torch {info['torch']}"
             f"{' (' + str(info['threads']) + ' threads)' if 'threads' in info else ''}, python {info['python']}."]
    if args.note:
        lines.append(f"- Note: {args.note}")
    errors = [r for r in rows if r["errors"]]
    if errors:
        lines.append("- Errors: " + "; ".join(f"{r['clients']} clients: {r['errors']} ({r['first_error']})" for r in errors))
    lines += ["", table(rows, engine_stats), ""]
    new = not RESULTS.exists()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        if new:
            f.write("# Serving load: N concurrent streaming chat clients against the OpenAI-compatible server\n\n"
                    "Written by `bench/serve_load.py --record`; one entry per run, newest last. Each client sends\n"
                    "its requests one after another. Latency is a whole request (sent to last chunk); TTFT is\n"
                    "the time to the first chunk with text; gen tok/s counts the server's completion tokens\n"
                    "over the wall time of the level; max batch seqs is the engine's (in-process runs only).\n\n")
        f.write("\n".join(lines) + "\n")
    print(f"recorded in {RESULTS}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (default: start one in-process)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu", help="in-process server only")
    ap.add_argument("--dtype", default=None, help="in-process server only")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--clients", default="1,8,32,64")
    ap.add_argument("--requests", type=int, default=4, help="requests per client, one after another")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--record", action="store_true", help="append an entry to bench/results/serve_load.md")
    ap.add_argument("--note", default="", help="a remark for the recorded entry (e.g. what else ran)")
    args = ap.parse_args()
    levels = [int(n) for n in args.clients.split(",")]

    with ExitStack() as stack:
        llm = None
        if args.url:
            base_url, server = args.url.rstrip("/"), f"`{args.url}` (already running)"
        else:
            from byzantium.backends import LLMPool
            from byzantium.server.app import ServerThread, build_app
            pool = stack.enter_context(LLMPool("native", device=args.device,
                                               **({"dtype": args.dtype} if args.dtype else {})))
            llm = pool.get(args.model)
            base_url = stack.enter_context(ServerThread(build_app({args.model: llm}, api_key=args.api_key)))
            describe = llm.describe()
            server = (f"in-process (build_app + ServerThread, clients in the same process), {describe.get('device')} "
                      f"{describe.get('dtype')}, attention {describe.get('attention_backend')}, linears "
                      f"{describe.get('linear_kernels')}")
        # A warm-up request (kernels built, caches touched); not counted.
        asyncio.run(run_level(base_url, argparse.Namespace(**{**vars(args), "requests": 1}), 1))
        load_before = os.getloadavg()[0]
        rows = []
        for n in levels:
            if llm is not None:
                llm.reset_stats()
            row = asyncio.run(run_level(base_url, args, n))
            if llm is not None:
                row["max_batch_seqs"] = llm.stats.get("max_batch_seqs")
            rows.append(row)
            print(f"{n:3d} clients: {row['requests']} requests ({row['errors']} errors) in {row['wall']:.1f} s, "
                  f"{row['req_per_s']:.2f} req/s, {row['tok_per_s']:.1f} tok/s, latency p50 {row['p50']:.2f} s, "
                  f"TTFT p50 {row['ttft_p50']:.2f} s" + (f", max batch {row['max_batch_seqs']}" if llm else ""),
                  flush=True)
        load = (load_before, os.getloadavg()[0])
    print()
    print(table(rows, llm is not None))
    if args.record:
        record(args, rows, machine(args), server, llm is not None, load)


if __name__ == "__main__":
    main()
