"""Batch drift and per-engine memory: a request alone vs the same request inside a batch of 64.

    PYTHONPATH=. python bench/batch_invariance.py [--smoke] [--out DIR]

What it reports: the probe's next-token logits alone vs in the batch (largest difference), and where its
greedy tokens part, if they do. What it asserts is only what the engine promises (docs/benchmarks.md, the GPU check):
on the CPU (fp32, --smoke) a request's tokens do not depend on its batch; on CUDA the batch may change the
GEMM kernels cuBLAS picks (1 row vs 64) and so the last bits of every sum, so the promise is that the logit
drift stays within the dtype's bound (bf16: 2^-4 of the logits' largest magnitude) and that greedy tokens
stay equal up to the first step whose two best logits (alone) are closer than twice the drift measured; past
such a near tie they may part. On CUDA it also builds two engines on the one device (an LLMPool's case)
and checks that the first one's `activations_peak_bytes` does not count the second's weights or KV pool,
and that a Qwen3-MoE engine decodes through CUDA graphs. Writes DIR/batch_invariance.json and prints one
verdict line. The model is a random Qwen3-0.6B-shaped one on CUDA (bf16), a tiny one with --smoke (CPU,
fp32): no network.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import QWEN3_06B, TINY, make_model  # noqa: E402  (bench/ is not a package)

BATCH, PROMPT_LEN, NEW = 64, 48, 32
# bf16/fp16 round every activation to 8/11 significant bits; fp32 (no TF32) only sums in another order
DRIFT_BOUND = {torch.bfloat16: 2.0 ** -4, torch.float16: 2.0 ** -7, torch.float32: 2.0 ** -13}


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def invariance(engine, vocab):
    from byzantium import SamplingParams
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, vocab, (PROMPT_LEN,), generator=g).tolist() for _ in range(BATCH)]
    probe, where = prompts[0], BATCH // 2
    prompts[where] = probe
    greedy = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    alone = list(engine.generate([probe], greedy)[0].token_ids)
    in_batch = list(engine.generate(prompts, greedy)[where].token_ids)
    differ = first_difference(alone, in_batch)
    logits_alone = engine.logits([probe])[0].float()
    logits_batch = engine.logits(prompts)[where].float()
    drift = float((logits_alone - logits_batch).abs().max())
    # each step's two best logits, alone: a margin under the drift is a near tie the batch may tip
    steps = engine.logits([probe + alone[:i] for i in range(NEW)]).float()
    top2 = steps.topk(2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    near_tie = next((i for i, m in enumerate(margins) if m <= 2 * drift), None)
    return {"identical_tokens": differ is None, "first_differing_token": differ, "logits_max_abs_diff": drift,
            "logits_scale": float(logits_alone.abs().max()), "first_near_tie": near_tie,
            "smallest_margin": min(margins), "batch": BATCH, "prompt_len": PROMPT_LEN, "new_tokens": NEW}


def promise_kept(result, dtype):
    """What the engine promises about a request alone vs in a batch (see the module's docstring)."""
    if dtype == torch.float32 and result["device"] == "cpu":
        return result["identical_tokens"]
    bound = DRIFT_BOUND[dtype] * result["logits_scale"]
    parted, tie = result["first_differing_token"], result["first_near_tie"]
    return result["logits_max_abs_diff"] <= bound and (parted is None or (tie is not None and parted >= tie))


def pool_memory(directory, kwargs):
    """Two engines on one device: the first one's activation peak must not grow by the second's memory."""
    from byzantium import Engine
    first = Engine(directory, **kwargs)
    alone = first.memory["activations_peak_bytes"]
    second = Engine(directory, **kwargs)
    first.logits([[1, 2, 3]])
    after = first.memory["activations_peak_bytes"]
    held = second.memory["weights_bytes"] + second.memory["kv_cache_bytes"]
    return {"activations_peak_alone": alone, "activations_peak_beside_second": after,
            "second_engine_bytes": held, "counts_other_engine": after is not None and after >= held}


def moe_graphs(directory, device):
    """A tiny Qwen3-MoE engine on CUDA: its decode steps are captured and replayed as CUDA graphs."""
    import transformers
    from byzantium import Engine, SamplingParams
    config = transformers.Qwen3MoeConfig(**dict(TINY, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2))
    torch.manual_seed(0)
    transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    engine = Engine(directory, device=str(device), dtype=torch.bfloat16, num_blocks=64, max_num_seqs=8,
                    max_model_len=128, enforce_eager=False)
    engine.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    graphs = engine.describe()["cuda_graphs"]
    return {"describe": graphs, "captured": bool(graphs.get("enabled") and graphs.get("captured"))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model: checks the script")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    args = ap.parse_args()
    from byzantium import Engine
    if args.smoke:
        device, dtype, shape = torch.device("cpu"), torch.float32, TINY
    elif torch.cuda.is_available():
        device, dtype, shape = torch.device("cuda"), torch.bfloat16, QWEN3_06B
    else:
        sys.exit("batch_invariance: torch sees no CUDA device (use --smoke for a CPU check of this script)")
    start, result = time.perf_counter(), {"device": str(device), "dtype": str(dtype)}
    with tempfile.TemporaryDirectory() as directory:
        make_model(shape, directory, device, dtype)
        kwargs = dict(device=str(device), dtype=dtype, num_blocks=BATCH * 6 + 16, max_num_seqs=BATCH,
                      max_model_len=PROMPT_LEN + NEW + 16)
        engine = Engine(directory, **kwargs)
        result.update(invariance(engine, shape["vocab_size"]))
        del engine
        if device.type == "cuda":
            result["pool"] = pool_memory(directory, kwargs)
    if device.type == "cuda":
        with tempfile.TemporaryDirectory() as directory:
            result["moe_graphs"] = moe_graphs(directory, device)
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["promise_kept"] = promise_kept(result, dtype)
    os.makedirs(args.out, exist_ok=True)
    name = "batch_invariance_smoke.json" if args.smoke else "batch_invariance.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(result, f, indent=1)
    ok = (result["promise_kept"] and not result.get("pool", {}).get("counts_other_engine", False)
          and result.get("moe_graphs", {}).get("captured", True))
    print(f"batch invariance: {'PASS' if ok else 'FAIL'}: tokens alone vs in a batch of {BATCH} "
          f"{'identical' if result['identical_tokens'] else 'part at token %s' % result['first_differing_token']}, "
          f"logits max |diff| {result['logits_max_abs_diff']:.3g} of {result['logits_scale']:.3g}, first near tie at "
          f"step {result['first_near_tie']}"
          + (f"; pool: activation peak {result['pool']['activations_peak_beside_second']} bytes beside a second engine "
             f"of {result['pool']['second_engine_bytes']}" if "pool" in result else "")
          + (f"; Qwen3-MoE decode graphs {'captured' if result['moe_graphs']['captured'] else 'NOT captured'}"
             if "moe_graphs" in result else ""))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
