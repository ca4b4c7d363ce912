"""RRMaj workload: this engine vs a plain transformers round-robin, the way a paper script would do it.

Workload: N=5 agents, 3 corrupted + 2 truthful (3c2t, one model), chunks of K=32 tokens, L=128, 8 gen-arith
questions x M=5 trajectories, sampled at temperature 0.7.

- engine: `rr_majority` on the native backend, all questions at once (every turn of every trajectory
  in flight together; each context's KV kept between turns, only new tokens prefilled).
- naive: transformers `generate`, trajectories one after another; on every turn the agent's whole
  context (chat prompt + the shared reply so far) is re-encoded. It is timed on a sample of the
  trajectories (--naive-sample; 0 = all) and its time and tokens are scaled to the whole workload.

    python bench/rr_workload.py [--model smollm2-135m] [--naive-sample 4]
"""
import argparse
import asyncio
import json
import platform
import time
from pathlib import Path

import torch

from byzantium.backends import load_llm
from byzantium.engine.loader import resolve_model
from byzantium.protocols.attacks import injection, make_agents
from byzantium.protocols.round_robin import rr_majority, speaking_order
from byzantium.protocols.rr_prompts import agent_messages
from byzantium.protocols.voting import stable_seed
from byzantium.tasks import get_task

N, C = 5, 3


def run_engine(model_dir, tasks, m, k, max_len, temperature, seed=0, dtype="float32"):
    """seed: the trajectories' speaking orders and sampling seeds (rr_majority's)."""
    llm = load_llm(model_dir, backend="native", device="cpu", dtype=dtype)
    agents = make_agents(llm, C, N)

    async def workload(tasks):
        return await asyncio.gather(*(rr_majority(t, agents, m=m, k=k, max_len=max_len, temperature=temperature,
                                                  seed=seed) for t in tasks))

    asyncio.run(workload(tasks[:1]))  # warm-up
    llm.reset_stats()
    start = time.perf_counter()
    results = asyncio.run(workload(tasks))
    seconds = time.perf_counter() - start
    s = llm.stats
    llm.close()
    trajs = [t for r in results for t in r.trajectories]
    return dict(seconds=seconds, prefill_tokens=s["prefill_tokens"], decode_tokens=s["decode_tokens"],
                generated_tokens=sum(t.num_tokens for t in trajs), trajectories=len(trajs),
                max_batch_seqs=s["max_batch_seqs"], correct=sum(r.correct for r in results))


def agent_prompts(tok, task):
    """The N agents' chat prompts as token ids (agents 0..C-1 corrupted); bench/peers.py sends them to vLLM."""
    inject = injection(task)
    return [tok.encode(tok.apply_chat_template(agent_messages(task, inject if i < C else None), tokenize=False,
                                               add_generation_prompt=True), add_special_tokens=False)
            for i in range(N)]


def naive_trajectory(model, tok, task, index, k, max_len, temperature):
    """One RR trajectory: each turn re-encodes the writer's prompt + the whole reply so far."""
    prompts = agent_prompts(tok, task)
    speakers = speaking_order(N, "shuffle", 0, task.id, index)  # the engine side's default order
    reply, prefill, decode, turn = [], 0, 0, 0
    while len(reply) < max_len:
        ids = torch.tensor([prompts[speakers[turn % N]] + reply])
        want = min(k, max_len - len(reply))
        torch.manual_seed(stable_seed("naive", task.id, index, turn))
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=want, do_sample=True,
                             temperature=temperature, top_k=0, top_p=1.0, pad_token_id=tok.eos_token_id)
        new = out[0, ids.shape[1]:].tolist()
        prefill += ids.shape[1]
        decode += max(len(new) - 1, 0)
        reply += new
        if tok.eos_token_id in new or len(new) < want:
            break
        turn += 1
    return prefill, decode, len(reply)


def run_naive(model_dir, tasks, m, k, max_len, temperature, sample, dtype="float32"):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    every = [(t, j) for t in tasks for j in range(m)]
    # A spread sample: trajectory j of question q for the first `sample` (q, j) on the diagonal.
    picked = every if not sample else [(tasks[i % len(tasks)], i % m) for i in range(0, sample * 3, 3)][:sample]
    with torch.inference_mode():
        naive_trajectory(model, tok, tasks[0], 99, 4, 8, temperature)  # warm-up
        start = time.perf_counter()
        runs = [naive_trajectory(model, tok, t, j, k, max_len, temperature) for t, j in picked]
        seconds = time.perf_counter() - start
    scale = len(every) / len(picked)
    measured = dict(seconds=seconds, trajectories=len(picked), prefill_tokens=sum(r[0] for r in runs),
                    decode_tokens=sum(r[1] for r in runs), generated_tokens=sum(r[2] for r in runs))
    scaled = {key: (v * scale if key != "trajectories" else len(every)) for key, v in measured.items()}
    return dict(measured=measured, scale=scale, scaled=scaled)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--m", type=int, default=5)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--naive-sample", type=int, default=4, help="trajectories the naive side runs (0 = all)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "rr_workload.json"))
    args = ap.parse_args()
    model_dir = resolve_model(args.model)
    tasks = get_task("gen-arith", args.questions, seed=0)
    cfg = (args.m, args.k, args.max_len, args.temperature)

    engine = run_engine(model_dir, tasks, *cfg)
    print(f"engine: {engine['seconds']:.1f} s for {engine['trajectories']} trajectories, prefill "
          f"{engine['prefill_tokens']} / decode {engine['decode_tokens']} tokens, max batch {engine['max_batch_seqs']}")
    naive = run_naive(model_dir, tasks, *cfg, args.naive_sample)
    me, sc = naive["measured"], naive["scaled"]
    print(f"naive: {me['seconds']:.1f} s for {me['trajectories']} trajectories (prefill {me['prefill_tokens']} / "
          f"decode {me['decode_tokens']}); scaled x{naive['scale']:.1f} to {sc['trajectories']}: {sc['seconds']:.1f} s, "
          f"prefill {sc['prefill_tokens']:.0f} / decode {sc['decode_tokens']:.0f} tokens")
    speedup = sc["seconds"] / engine["seconds"]
    print(f"speed-up: {speedup:.1f}x (naive scaled from a sample of {me['trajectories']} trajectories)"
          if args.naive_sample else f"speed-up: {speedup:.1f}x")
    # The sample's trajectories may be shorter or longer than the engine's: the same, per generated token.
    per_token = (me["seconds"] / max(me["generated_tokens"], 1)) / (engine["seconds"] / max(engine["generated_tokens"], 1))
    print(f"speed-up per generated token: {per_token:.1f}x (generated: engine {engine['generated_tokens']}, "
          f"naive sample {me['generated_tokens']})")

    result = dict(config=dict(n=N, corrupted=C, m=args.m, k=args.k, max_len=args.max_len, questions=args.questions,
                              task="gen-arith", temperature=args.temperature, model=args.model,
                              naive_sample=args.naive_sample),
                  machine=dict(platform=platform.platform(), torch=torch.__version__, threads=torch.get_num_threads()),
                  engine=engine, naive=naive, speedup=speedup,
                  speedup_per_generated_token=per_token)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
