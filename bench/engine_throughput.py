"""Prefill and decode throughput of the Byzantium engine vs transformers `generate`, same model, same run.

For each batch size both sides get the same random prompts (equal lengths, so transformers needs no
padding) and generate with EOS ignored. Prefill tok/s = prompt tokens / time of a 1-token generation;
decode tok/s = generated tokens after the first / (time of the full generation - that prefill time).

    python bench/engine_throughput.py [--model smollm2-135m] [--batches 1,8,32] [--prompt-len 128] [--new 64]
"""
import argparse
import json
import platform
import time
from pathlib import Path

import torch

from byzantium import Engine, SamplingParams
from byzantium.engine.loader import resolve_model


def timed(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(generate, batch, prompt_len, new_tokens, repeats):
    prefill_s = timed(lambda: generate(1), repeats)
    total_s = timed(lambda: generate(new_tokens), repeats)
    return {"prefill_tok_s": batch * prompt_len / prefill_s,
            "decode_tok_s": batch * (new_tokens - 1) / max(total_s - prefill_s, 1e-9),
            "prefill_s": prefill_s, "total_s": total_s}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine_throughput.json"))
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    model_dir = resolve_model(args.model)
    engine = Engine(model_dir, dtype="float32", device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = engine.config.vocab_size
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        g = torch.Generator().manual_seed(batch)
        prompts = torch.randint(100, vocab - 100, (batch, args.prompt_len), generator=g)
        ids = prompts.tolist()

        def ours(n):
            # A fresh prefix each run: no prefix-cache hits between repeats.
            fresh = [[(t + run[0]) % vocab for t in p] for p in ids]
            run[0] += 1
            engine.generate(fresh, SamplingParams(max_tokens=n, ignore_eos=True))

        def theirs(n):
            with torch.inference_mode():
                hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, pad_token_id=0)

        run = [0]
        ours(2)  # warm up both
        theirs(2)
        mine = measure(ours, batch, args.prompt_len, args.new, args.repeats)
        ref = measure(theirs, batch, args.prompt_len, args.new, args.repeats)
        rows.append({"batch": batch, "byzantium": mine, "transformers": ref,
                     "prefill_ratio": mine["prefill_tok_s"] / ref["prefill_tok_s"],
                     "decode_ratio": mine["decode_tok_s"] / ref["decode_tok_s"]})
        print(f"batch {batch:3d}: prefill {mine['prefill_tok_s']:8.1f} vs {ref['prefill_tok_s']:8.1f} tok/s "
              f"({rows[-1]['prefill_ratio']:.2f}x)   decode {mine['decode_tok_s']:7.1f} vs {ref['decode_tok_s']:7.1f} "
              f"tok/s ({rows[-1]['decode_ratio']:.2f}x)", flush=True)
    result = {"model": args.model, "dtype": "float32", "device": "cpu", "threads": torch.get_num_threads(),
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
