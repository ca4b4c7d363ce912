"""A sliding-window model on the CPU: the compiled CPU kernels (what "auto" picks) against the torch backend.

A random Gemma 3 built from a config shaped like Gemma 3 270M (18 layers, five sliding-window layers to one
global, head size 256, one KV head; a smaller vocabulary), saved to a temporary directory, run by two engines
that differ only in attention_backend. Prompts longer than the window, so the mask acts in prefill and
decode. Prefill and decode throughput from the engine's step records; rounds alternate between the two,
the first warms up and is not counted, the best of --repeats counts. The greedy tokens must agree.

    python bench/window_attention.py [--batches 1,8] [--prompt-len 1024] [--new 64] [--window 512]
"""
import argparse
import platform
import tempfile

import torch

from byzantium import Engine, SamplingParams

LAYERS = 18
CONFIG = dict(vocab_size=32768, hidden_size=640, intermediate_size=2048, num_attention_heads=4, num_key_value_heads=1,
              head_dim=256, query_pre_attn_scalar=256, max_position_embeddings=32768, bos_token_id=2, eos_token_id=1,
              pad_token_id=0, tie_word_embeddings=True,
              layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(LAYERS)])


def save_model(path, window):
    import transformers
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**CONFIG, num_hidden_layers=LAYERS, sliding_window=window)
    transformers.Gemma3ForCausalLM(config).save_pretrained(path)


def run(engine, prompts, new_tokens):
    engine.reset_stats()
    outs = engine.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    s = engine.stats
    return (s["prefill_tok_per_s"], s["decode_tok_per_s"]), [o.token_ids for o in outs]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as path:
        save_model(path, args.window)
        engines = {name: Engine(path, dtype="float32", device="cpu", attention_backend=name)
                   for name in ("cpu", "torch")}
    assert engines["cpu"].describe()["attention_backend"] == "cpu"
    print(f"threads {torch.get_num_threads()}, torch {torch.__version__}, {platform.machine()}, window {args.window}, "
          f"prompt {args.prompt_len}, new {args.new}")
    print("\n| batch | prefill tok/s (cpu / torch) | ratio | decode tok/s (cpu / torch) | ratio |")
    print("|---|---|---|---|---|")
    vocab = CONFIG["vocab_size"]
    for batch in [int(b) for b in args.batches.split(",")]:
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(100, vocab - 100, (batch, args.prompt_len), generator=g).tolist()
        best = {name: [0.0, 0.0] for name in engines}
        for r in range(args.repeats + 1):  # the first round warms both up and is not counted
            fresh = [[(t + r) % vocab for t in p] for p in ids]  # no prefix-cache hits between rounds
            tokens = {}
            for name, engine in engines.items():
                times, tokens[name] = run(engine, fresh, args.new)
                if r:
                    best[name] = [max(a, b) for a, b in zip(best[name], times)]
            assert tokens["cpu"] == tokens["torch"], "the two backends gave different greedy tokens"
        (cp, cd), (tp, td) = best["cpu"], best["torch"]
        print(f"| {batch} | {cp:.0f} / {tp:.0f} | {cp / tp:.2f}x | {cd:.1f} / {td:.1f} | {cd / td:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
