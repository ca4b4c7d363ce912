"""`byzantium ...`: the command line.

    byzantium demo                      batched chat generation on the embedded model, with engine stats
    byzantium generate "prompt" ...     generate for prompts given on the command line
"""
import argparse
import json
import sys
import time

DEMO_QUESTIONS = [
    "What is 17 + 25? Answer with the number only.",
    "Name the largest planet in the solar system.",
    "Which is heavier, a kilogram of feathers or a kilogram of iron?",
    "Give one word that rhymes with 'cat'.",
    "What is the capital of Japan?",
    "If a train leaves at 3 pm and travels for 2 hours, when does it arrive?",
    "Is 91 a prime number? Answer yes or no and why.",
    "Translate 'good morning' into French.",
]


def engine_args(ap):
    ap.add_argument("--model", default=None, help="smollm2-135m (default), an HF directory, a .gguf file or a hub id")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16 (default: bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--trace", default=None, help="write the engine's steps as a Chrome trace to this file")


def make_engine(args):
    from . import Engine, SamplingParams
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


def cmd_demo(args):
    engine, params = make_engine(args)
    conversations = [[{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": q}]
                     for q in DEMO_QUESTIONS]
    print(f"Answering {len(conversations)} questions in one batch on {args.model or 'smollm2-135m'} "
          f"({engine.device}, {str(engine.dtype).replace('torch.', '')}) ...", flush=True)
    start = time.perf_counter()
    outputs = engine.chat(conversations, params)
    seconds = time.perf_counter() - start
    for question, out in zip(DEMO_QUESTIONS, outputs):
        print(f"\nQ: {question}\nA: {out.text.strip()}")
    print_stats(engine, seconds, args.trace)


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


def main(argv=None):
    ap = argparse.ArgumentParser(prog="byzantium", description="Multi-agent LLM protocols under Byzantine faults.")
    sub = ap.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="batched chat generation on the embedded model")
    engine_args(demo)
    demo.set_defaults(func=cmd_demo)
    gen = sub.add_parser("generate", help="generate for prompts given on the command line")
    gen.add_argument("prompts", nargs="+")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    gen.add_argument("--json", action="store_true", help="one JSON line per prompt")
    engine_args(gen)
    gen.set_defaults(func=cmd_generate)
    args = ap.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, TypeError) as error:  # bad input: a clear message, not a traceback
        print(f"byzantium: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
