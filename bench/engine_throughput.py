"""Prefill and decode throughput of the Byzantium engine vs transformers `generate`, same model, same run.

For each batch size both sides get the same random prompts (equal lengths, so transformers needs no
padding) and generate with EOS ignored. Prefill and decode are timed separately inside one generation:
transformers through a stopping criterion that stamps the time of every generated token (prefill = time
to the first token; decode = first to last token), the engine through its per-step records (steps that
prefill vs pure decode steps; a step that prefills counts as prefill). Runs alternate between the two engines; the best of --repeats counts.

    python bench/engine_throughput.py [--model smollm2-135m] [--batches 1,8,32] [--prompt-len 128] [--new 64]
        [--dtype float32|bfloat16]
"""
import argparse
import json
import platform
import time
from pathlib import Path

import torch

from byzantium import Engine, SamplingParams
from byzantium.engine.loader import resolve_model


class Stamps:
    """A transformers StoppingCriteria that never stops and records when each token was generated."""

    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def run_transformers(hf, prompts, new_tokens):
    from transformers import StoppingCriteriaList
    stamps = Stamps()
    start = time.perf_counter()
    with torch.inference_mode():
        hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                    stopping_criteria=StoppingCriteriaList([stamps]))
    batch, prompt_len = prompts.shape
    return batch * prompt_len / (stamps.times[0] - start), batch * (new_tokens - 1) / (stamps.times[-1] - stamps.times[0])


def run_engine(engine, prompts, new_tokens):
    engine.reset_stats()
    engine.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    s = engine.stats
    return s["prefill_tok_per_s"], s["decode_tok_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="both sides' dtype (bfloat16: the CPU's bf16 units where it has them)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine_throughput.json"))
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    model_dir = resolve_model(args.model)
    engine = Engine(model_dir, dtype=args.dtype, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).eval()
    vocab = engine.config.vocab_size
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        g = torch.Generator().manual_seed(batch)
        prompts = torch.randint(100, vocab - 100, (batch, args.prompt_len), generator=g)
        ids = prompts.tolist()

        best = {"byzantium": [0.0, 0.0], "transformers": [0.0, 0.0]}
        for r in range(args.repeats + 1):  # the first round warms both up and is not counted
            fresh = [[(t + r) % vocab for t in p] for p in ids]  # no prefix-cache hits between rounds
            for name, times in (("byzantium", run_engine(engine, fresh, args.new)),
                                ("transformers", run_transformers(hf, torch.tensor(fresh), args.new))):
                if r:
                    best[name] = [max(a, b) for a, b in zip(best[name], times)]
        mine, ref = ({"prefill_tok_s": p, "decode_tok_s": d} for p, d in (best["byzantium"], best["transformers"]))
        rows.append({"batch": batch, "byzantium": mine, "transformers": ref,
                     "prefill_ratio": mine["prefill_tok_s"] / ref["prefill_tok_s"],
                     "decode_ratio": mine["decode_tok_s"] / ref["decode_tok_s"]})
        print(f"batch {batch:3d}: prefill {mine['prefill_tok_s']:8.1f} vs {ref['prefill_tok_s']:8.1f} tok/s "
              f"({rows[-1]['prefill_ratio']:.2f}x)   decode {mine['decode_tok_s']:7.1f} vs {ref['decode_tok_s']:7.1f} "
              f"tok/s ({rows[-1]['decode_ratio']:.2f}x)", flush=True)
    result = {"model": args.model, "dtype": args.dtype, "linear_kernels": engine.describe()["linear_kernels"], "device": "cpu", "threads": torch.get_num_threads(),
              "torch": torch.__version__, "machine": platform.machine(), "prompt_len": args.prompt_len,
              "new_tokens": args.new, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("\n| batch | prefill tok/s (ours / transformers) | ratio | decode tok/s (ours / transformers) | ratio |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['byzantium']['prefill_tok_s']:.0f} / {r['transformers']['prefill_tok_s']:.0f} | "
              f"{r['prefill_ratio']:.2f}x | {r['byzantium']['decode_tok_s']:.1f} / {r['transformers']['decode_tok_s']:.1f} | "
              f"{r['decode_ratio']:.2f}x |")


if __name__ == "__main__":
    main()
