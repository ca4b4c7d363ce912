"""One SAC round (n=7: 6 honest + 1 adversary, complete graph, F=3) on 4 gen-arith problems, in generate
mode (judge limited to --judge-tokens new tokens) and in logprob mode: this engine vs the `hf` backend
issuing one request at a time (the way the reference code drives its server).

Both sides make exactly the same calls. The native side runs `run_sac` with T=1 on all problems at
once; every agent's calls go through a recording proxy, which holds round 1 until every problem has
finished round 0 (stats are reset there). Measured: round 1 (the neighbour scoring of every honest
agent, then refine and re-score). Each agent refines as soon as its own judgements are in (run_sac), so
the phases overlap; the scoring phase is timed to the end of the round's last judgement. --lockstep
issues the phases one after another per problem, as the SAC reference does. Every round-1 prompt is recorded
and the same prompts, with the same sampling parameters, are then run on the hf backend one after
another. The hf side is timed on a random sample of the calls of each phase (--hf-sample; 0 = all) and
scaled up to the whole phase by forward passes (greedy decoding gives hf the native run's reply lengths,
checked on the sample), and also by call count. Token counts are exact: prefill = the prompts' lengths,
decode = the replies' lengths.

On a machine shared with other jobs, torch's default of one thread per core collapses when another
process holds a core (measured here: prefill 10x slower); --threads 1 keeps both sides comparable.

    python bench/sac_round.py [--model smollm2-135m] [--problems 4] [--judge-tokens 64] [--solve-tokens 128]
                              [--hf-sample 8] [--modes generate,logprob] [--threads 1]
"""
import argparse
import asyncio
import json
import os
import platform
import random
import time
from pathlib import Path

import torch

from byzantium.backends import load_llm
from byzantium.engine.loader import resolve_model
from byzantium.engine.sampling import SamplingParams
from byzantium.protocols import prompts
from byzantium.protocols.byzantine import make_agents
from byzantium.protocols.graphs import complete
from byzantium.protocols.sac import run_sac
from byzantium.tasks import get_task

N, F = 7, 3
HONEST = N - 1
PHASES = ("score", "refine", "rescore")
TOKENS = ("prefill_tokens", "decode_tokens", "cached_tokens")


class Round:
    """What the proxies of all agents share: the gate of round 1, the clock and the recorded round-1 calls."""

    def __init__(self, llm, problems):
        self.llm, self.problems = llm, problems
        self.round0_done = self.scores_done = 0
        self.round1 = asyncio.Event()  # every problem finished round 0
        self.calls, self.times, self.stats = [], {}, {}

    def finished_round0(self):
        self.round0_done += 1
        if self.round0_done == self.problems * 2 * HONEST:  # round 0: one solve and one self-score each
            self.llm.reset_stats()
            self.times["round1"] = time.perf_counter()
            self.round1.set()

    def finished_score(self):
        self.scores_done += 1
        if self.scores_done == self.problems * HONEST * (N - 1):
            self.stats["score"] = dict(self.llm.stats)
            self.times["scored"] = time.perf_counter()


class Proxy:
    """One agent calls the shared LLM through this: it tells round 0 from round 1 by counting calls, holds
    round-1 calls at the gate and records them."""

    def __init__(self, llm, shared):
        self.llm, self.name, self.shared, self.count, self.refined = llm, llm.name, shared, 0, False

    def _phase(self, judge):
        self.count += 1
        if self.count <= 2:  # round 0: its solve and its self-score
            return None
        if not judge:
            self.refined = True
            return "refine"
        return "rescore" if self.refined else "score"

    async def _call(self, phase, kind, messages, run, **extra):
        if phase is None:
            out = await run()
            self.shared.finished_round0()
            return out
        await self.shared.round1.wait()
        out = await run()
        call = dict(phase=phase, kind=kind, messages=messages, **extra)
        if kind == "logprob":
            call["prompt_tokens"] = self.llm.count_tokens(messages)
        else:
            call.update(prompt_tokens=out.prompt_tokens, generated=len(out.token_ids))
        self.shared.calls.append(call)
        if phase == "score":
            self.shared.finished_score()
        return out

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        judge = messages[0]["content"] == prompts.JUDGE_SYSTEM
        return await self._call(self._phase(judge), "judge" if judge else "solve", messages,
                                lambda: self.llm.chat(messages, params, untrusted, tag=tag), params=params)

    async def score(self, messages, candidates, untrusted=False, tag=None):
        return await self._call(self._phase(True), "logprob", messages,
                                lambda: self.llm.score(messages, candidates, untrusted, tag=tag), candidates=candidates)


def run_native(model_dir, tasks, mode, solve, judge, llm=None, dtype="float32", lockstep=False):
    """llm: another LLM to drive the same way (bench/peers.py passes vLLM's server); None = the native engine
    (in `dtype`). lockstep: run_sac's."""
    own = llm is None
    llm = llm or load_llm(model_dir, backend="native", device="cpu", dtype=dtype)
    cache = [(t.id, t.gold) for t in get_task("gen-arith", 20, seed=1)]

    async def main():
        shared = Round(llm, len(tasks))
        runs = []
        for t in tasks:
            agents = make_agents(llm, n=N, weak=0, byzantine=1, task=t, cache=cache, seed=0)
            for a in agents:
                if a.honest:
                    a.llm = Proxy(llm, shared)
            runs.append(run_sac(t, complete(N), agents, F, T=1, score_mode=mode, solve_params=solve,
                                judge_params=judge, lockstep=lockstep))
        start = time.perf_counter()
        records = await asyncio.gather(*runs)
        end = time.perf_counter()
        return shared, records, start, end

    load = os.getloadavg()[0]
    shared, records, start, end = asyncio.run(main())
    total = llm.stats
    if own:
        llm.close()
    t1, t2 = shared.times["round1"], shared.times["scored"]
    scoring = shared.stats["score"]
    rest = {k: total[k] - scoring[k] for k in TOKENS}
    return dict(round0_seconds=t1 - start, seconds=end - t1, score_seconds=t2 - t1, rest_seconds=end - t2,
                **{k: total[k] for k in TOKENS}, score_tokens={k: scoring[k] for k in TOKENS},
                rest_tokens=rest, steps=total.get("steps"), max_batch_seqs=total.get("max_batch_seqs"),
                preemptions=total.get("preemptions"), load_before=load, load_after=os.getloadavg()[0],
                calls={p: sum(c["phase"] == p for c in shared.calls) for p in PHASES},
                records=records), shared.calls


def passes(call):
    """Forward passes a call takes on hf: one for a logprob score; a prefill and then one a generated
    token after the first for a chat call."""
    return call.get("generated", 1)


def run_hf(hf, calls, sample, seed):
    """Each phase's calls, one at a time on hf, timed on a random sample and scaled to the phase: by
    forward passes (the headline: a sample of long judges would otherwise stand for the short ones too;
    greedy decoding gives hf the native run's lengths, checked on the sample) and by call count."""

    async def one(call):
        if call["kind"] == "logprob":
            await hf.score(call["messages"], call["candidates"])
            return None
        return len((await hf.chat(call["messages"], call["params"])).token_ids)

    async def main():
        # One event loop for every call: hf runs them on the loop's worker thread, and torch's first
        # calls on a fresh thread are several times slower (measured here: ~5 s vs ~1.2 s a call).
        await one(calls[0])  # warm-up, not timed
        rng = random.Random(seed)
        phases = {}
        for phase in PHASES:
            todo = [c for c in calls if c["phase"] == phase]
            if not todo:
                continue
            picked = todo if not sample or sample >= len(todo) else rng.sample(todo, sample)
            hf.reset_stats()
            start = time.perf_counter()
            generated = [await one(c) for c in picked]
            seconds = time.perf_counter() - start
            chat = picked[0]["kind"] != "logprob"
            phases[phase] = dict(
                calls=len(todo), measured=len(picked), measured_seconds=seconds,
                seconds=seconds * sum(map(passes, todo)) / sum(map(passes, picked)),
                seconds_by_calls=seconds * len(todo) / len(picked),
                prefill_tokens=sum(c["prompt_tokens"] for c in todo),
                decode_tokens=sum(passes(c) - 1 for c in todo), measured_decode_tokens=hf.stats["decode_tokens"],
                same_length_as_native=sum(g == c["generated"] for g, c in zip(generated, picked)) if chat else None)
        return phases

    load = os.getloadavg()[0]
    phases = asyncio.run(main())
    keys = ("seconds", "seconds_by_calls", "prefill_tokens", "decode_tokens")
    return dict(phases=phases, **{k: sum(p[k] for p in phases.values()) for k in keys}, cached_tokens=0,
                load_before=load, load_after=os.getloadavg()[0])


def fmt_tokens(d):
    return f"prefill {d['prefill_tokens']:.0f} / decode {d['decode_tokens']:.0f} / cached {d['cached_tokens']:.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--judge-tokens", type=int, default=64)
    ap.add_argument("--solve-tokens", type=int, default=128, help="max new tokens of solve and refine")
    ap.add_argument("--hf-sample", type=int, default=8, help="calls per phase timed on hf (0 = all)")
    ap.add_argument("--modes", default="generate,logprob")
    ap.add_argument("--threads", type=int, default=0, help="torch threads for both sides (0 = torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lockstep", action="store_true", help="each phase of the round waits for the whole phase")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sac_round"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    tasks = get_task("gen-arith", args.problems, seed=args.seed)
    solve = SamplingParams(max_tokens=args.solve_tokens, temperature=0.0)
    judge = SamplingParams(max_tokens=args.judge_tokens, temperature=0.0)
    hf = load_llm(model_dir, backend="hf", device="cpu")

    results = {}
    for mode in args.modes.split(","):
        native, calls = run_native(model_dir, tasks, mode, solve, judge, lockstep=args.lockstep)
        records = native.pop("records")
        base = run_hf(hf, calls, args.hf_sample, args.seed)
        results[mode] = r = dict(
            native=native, hf=base, speedup=base["seconds"] / native["seconds"],
            speedup_by_calls=base["seconds_by_calls"] / native["seconds"],
            score_speedup=base["phases"]["score"]["seconds"] / native["score_seconds"],
            score_parse_failures=sum(a.get("score_failures", 0) for rec in records for a in rec["rounds"][1]["agents"]))
        print(f"[{mode}] round-1 calls: " + ", ".join(f"{p} {native['calls'][p]}" for p in PHASES))
        print(f"  native: {native['seconds']:.1f} s (scoring {native['score_seconds']:.1f} s, refine + re-score "
              f"{native['rest_seconds']:.1f} s), {fmt_tokens(native)}, {native['steps']} steps, max batch "
              f"{native['max_batch_seqs']}; round 0 took {native['round0_seconds']:.1f} s (not compared)")
        for p, d in base["phases"].items():
            print(f"  hf {p}: {d['measured']} of {d['calls']} calls timed, {d['measured_seconds']:.1f} s; scaled "
                  f"{d['seconds']:.1f} s by forward passes, {d['seconds_by_calls']:.1f} s by calls")
        print(f"  hf (one request at a time, timed on samples and scaled): {base['seconds']:.1f} s, {fmt_tokens(base)}")
        print(f"  speed-up: {r['speedup']:.1f}x for the round ({r['speedup_by_calls']:.1f}x scaling hf by calls), "
              f"{r['score_speedup']:.1f}x for its scoring phase; load average {native['load_before']:.1f}-"
              f"{native['load_after']:.1f} (native), {base['load_before']:.1f}-{base['load_after']:.1f} (hf)")
    hf.close()

    machine = dict(platform=platform.platform(), torch=torch.__version__, threads=torch.get_num_threads(),
                   note="2 CPU cores shared with other jobs, so times are noisy")
    config = dict(n=N, F=F, topology="complete", problems=args.problems, task="gen-arith", seed=args.seed,
                  judge_tokens=args.judge_tokens, solve_tokens=args.solve_tokens, hf_sample=args.hf_sample,
                  model=args.model, lockstep=args.lockstep)
    command = " ".join(["python bench/sac_round.py"] + [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                         if k != "out" and ap.get_default(k) != v])
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(dict(command=command, config=config, machine=machine,
                                                        results=results), indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(report(command, config, machine, results))


def report(command, config, machine, results):
    lines = [f"# One SAC round: native engine vs hf one request at a time (CPU, {config['model']})", "",
             f"Command: `{command}`. n={config['n']} (6 honest, 1 adversary), complete graph, F={config['F']}, "
             f"{config['problems']} gen-arith problems at once, greedy; judge <= {config['judge_tokens']} new "
             f"tokens (generate mode), solve/refine <= {config['solve_tokens']}. Raw numbers: `sac_round.json`.",
             f"Machine: {machine['platform']}, torch {machine['torch']}, {machine['threads']} torch threads; "
             f"{machine['note']}.", "",
             "Measured: round 1 (every honest agent scores its 6 neighbours, refines, re-scores a changed "
             "answer), after round 0 of every problem. Both sides make the same calls: the native run's "
             "round-1 prompts are replayed on hf one at a time. hf is timed on a random sample of each "
             f"phase's calls ({config['hf_sample'] or 'all'} a phase) and scaled to the phase by forward "
             "passes (greedy: hf writes the native run's lengths, checked on the sample); scaled by call "
             "count in brackets.", "",
             "| mode | side | wall time | scoring phase | prefill | decode | cached | load avg |",
             "|---|---|---|---|---|---|---|---|"]
    for mode, r in results.items():
        n, h = r["native"], r["hf"]
        lines.append(f"| {mode} | native (all problems at once) | {n['seconds']:.1f} s | {n['score_seconds']:.1f} s | "
                     f"{n['prefill_tokens']} | {n['decode_tokens']} | {n['cached_tokens']} | "
                     f"{n['load_before']:.1f}-{n['load_after']:.1f} |")
        lines.append(f"| {mode} | hf (sequential, sampled and scaled) | {h['seconds']:.1f} s "
                     f"({h['seconds_by_calls']:.1f} s) | {h['phases']['score']['seconds']:.1f} s | "
                     f"{h['prefill_tokens']} | {h['decode_tokens']} | 0 | {h['load_before']:.1f}-{h['load_after']:.1f} |")
    lines += ["", "| mode | speed-up (round) | speed-up (scoring phase) | target | native steps, max batch | "
              "calls (score/refine/rescore) | hf calls timed |", "|---|---|---|---|---|---|---|"]
    targets = {"generate": 10, "logprob": 3}
    for mode, r in results.items():
        n, ph = r["native"], r["hf"]["phases"]
        c = n["calls"]
        timed = ", ".join(f"{p} {d['measured']}/{d['calls']}" for p, d in ph.items())
        lines.append(f"| {mode} | **{r['speedup']:.1f}x** ({r['speedup_by_calls']:.1f}x) | "
                     f"{r['score_speedup']:.1f}x | >= {targets.get(mode, '?')}x | "
                     f"{n['steps']}, {n['max_batch_seqs']} | {c['score']}/{c['refine']}/{c['rescore']} | {timed} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
