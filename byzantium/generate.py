"""`byzantium generate "prompt" ...`: generate for prompts given on the command line, straight on the
engine (no protocol), and print the texts and the engine's counters."""
import json
import time

from .commands import Command


def engine_args(ap):
    ap.add_argument("--model", default=None, help="smollm2-135m (default), an HF directory, a .gguf file or a hub id")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16 (default: bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--trace", default=None, help="write the engine's steps as a Chrome trace to this file")


def add_generate_args(ap):
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    ap.add_argument("--json", action="store_true", help="one JSON line per prompt")
    engine_args(ap)


def make_engine(args):
    from . import Engine, SamplingParams  # here, not at import: `byzantium --help` and `plan` start without torch
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)  # checked first
    return Engine(args.model, device=args.device, dtype=args.dtype), params


def print_stats(engine, seconds, trace):
    s = engine.stats
    print(f"\n{s['steps']} steps in {seconds:.1f} s; batch of up to {s['max_batch_seqs']} sequences; "
          f"prefill {s['prefill_tokens']} tokens ({s['prefill_tok_per_s']:.0f} tok/s), "
          f"decode {s['decode_tokens']} tokens ({s['decode_tok_per_s']:.1f} tok/s), "
          f"{s['cached_tokens']} prompt tokens from the prefix cache, {s['preemptions']} preemptions")
    if trace:
        engine.step_records.to_chrome_trace(trace)
        print(f"Chrome trace written to {trace}")


def cmd_generate(args):
    engine, params = make_engine(args)
    start = time.perf_counter()
    if args.chat:
        outputs = engine.chat([[{"role": "user", "content": p}] for p in args.prompts], params)
    else:
        outputs = engine.generate(args.prompts, params)
    for prompt, out in zip(args.prompts, outputs):
        if args.json:
            print(json.dumps({"prompt": prompt, "text": out.text, "finish_reason": out.finish_reason,
                              "tokens": len(out.token_ids)}))
        else:
            print(f"--- {prompt}\n{out.text}")
    if not args.json:
        print_stats(engine, time.perf_counter() - start, args.trace)


COMMAND = Command("generate", "generate for prompts given on the command line", add_generate_args, cmd_generate)
