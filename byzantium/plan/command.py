"""`byzantium plan MODEL...`: the command (its flags, their checks, a table per model or --json). The
rules are in byzantium/plan/__init__.py and in `byzantium plan --help`."""
import argparse
import json

from ..commands import Command
from . import __doc__ as RULES
from .facts import model_facts
from .fit import (ACTIVATION_RESERVE_GIB, DEFAULT_SEQS, GIB, H200_GIB, KV_DTYPES, MEMORY_FRACTION, kv_bytes_per_token,
                  params, plan_model, weight_bytes)

DEFAULT_LEN = 4096


def add_plan_args(ap):
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.description = RULES.split("\n\n    facts.py")[0]
    ap.add_argument("models", nargs="*", metavar="MODEL",
                    help="hub ids (the papers' models are built in), checkpoint directories, or smollm2-135m")
    ap.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs a model may be split over (default 1)")
    ap.add_argument("--gpu-memory", type=float, default=H200_GIB, metavar="GiB",
                    help=f"memory of one GPU in GiB as CUDA reports it (default {H200_GIB:g}, one H200; an "
                         "A100-80GB or H100-80GB is about 79.2)")
    ap.add_argument("--memory-fraction", type=float, default=MEMORY_FRACTION, metavar="F",
                    help=f"the share of each GPU the plan uses (default {MEMORY_FRACTION:g}, as the engine's)")
    ap.add_argument("--max-num-seqs", type=int, default=DEFAULT_SEQS, metavar="S",
                    help=f"sequences the KV cache must hold at full length at once (default {DEFAULT_SEQS}: a "
                         "floor; the engine batches more when they are shorter)")
    ap.add_argument("--max-model-len", type=int, default=DEFAULT_LEN, metavar="L",
                    help=f"tokens per sequence, prompt and generation (default {DEFAULT_LEN})")
    ap.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto",
                    help="auto (bf16, default) or fp8 (half the KV bytes)")
    ap.add_argument("--no-fp8", action="store_true",
                    help="plan bf16 weights only (GPUs without FP8 arithmetic, e.g. an A100)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the tables")


def check_args(args):
    """The flags' checks, before any model is looked up."""
    if not args.models:
        raise ValueError("name at least one model: byzantium plan MODEL... (hub ids, checkpoint directories)")
    if args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
    if not args.gpu_memory > 0:
        raise ValueError(f"--gpu-memory must be > 0 GiB, got {args.gpu_memory:g}")
    if not 0 < args.memory_fraction <= 1:
        raise ValueError(f"--memory-fraction must be in (0, 1], got {args.memory_fraction:g}")
    for flag in ("max_num_seqs", "max_model_len"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")


def plan_one(facts, args):
    """One model's plan as plain data (what --json prints)."""
    need = args.max_num_seqs * args.max_model_len
    opts, chosen = plan_model(facts, args.gpus, args.gpu_memory * GIB, need, args.memory_fraction,
                              args.kv_cache_dtype, fp8=not args.no_fp8)
    count = params(facts)
    row = {"model": facts.name, "source": facts.source, "params": count["total"], "text_params": count["text"],
           "active_params": count["active"], "context": facts.context, "fp8_checkpoint": facts.fp8_checkpoint,
           "weights_gib": {q: round(weight_bytes(facts, q) / GIB, 2)
                           for q in (("fp8",) if facts.fp8_checkpoint else ("bf16", "fp8"))},
           "kv_bytes_per_token": kv_bytes_per_token(facts, 1, args.kv_cache_dtype),
           "options": [{"tensor_parallel_size": o.tp, "quantization": o.quantization,
                        "weights_gib_per_gpu": round(o.weights / GIB, 2), "kv_gib_per_gpu": round(o.kv_bytes / GIB, 2),
                        "kv_tokens": o.kv_tokens, "fits": o.fits} for o in opts],
           "plan": None if chosen is None else {"tensor_parallel_size": chosen.tp, "quantization": chosen.quantization,
                                                "kv_tokens": chosen.kv_tokens, "flags": chosen.flags(facts)}}
    if chosen is None:
        row["why"] = why_not(facts, opts, args, need)
    return row


def why_not(facts, opts, args, need):
    if not opts:
        return ("an FP8 checkpoint with --no-fp8" if facts.fp8_checkpoint and args.no_fp8 else
                f"no TP size up to --gpus {args.gpus} divides its heads ({facts.heads})")
    best = max(opts, key=lambda o: (o.kv_tokens, o.kv_bytes))
    if best.kv_bytes <= 0:
        return f"the weights alone do not fit ({best.label()}: {best.weights / GIB:.1f} GiB a GPU)"
    return f"at most {best.kv_tokens:,} KV tokens ({best.label()}), {need:,} needed"


def _b(n):
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def describe(row, args):
    """One model's plan as a table."""
    need = args.max_num_seqs * args.max_model_len
    lines = [f"{row['model']}  ({row['source']})"]
    note = f"text {_b(row['text_params'])} loaded"
    if row["active_params"] != row["text_params"]:
        note += f", {_b(row['active_params'])} active a token"
    if row["params"] != row["text_params"]:
        note += f"; vision {_b(row['params'] - row['text_params'])} not loaded"
    lines.append(f"  parameters {_b(row['params'])} ({note})" +
                 (f"; context {row['context']:,}" if row["context"] else ""))
    if row["context"] and args.max_model_len > row["context"]:
        lines.append(f"  note: --max-model-len {args.max_model_len} is more than its context ({row['context']:,})")
    weights = ", ".join(f"{q} {gib:.1f} GiB" for q, gib in row["weights_gib"].items())
    kv = "fp8" if args.kv_cache_dtype == "fp8" else "bf16"
    lines.append(f"  weights {weights}" + (" (an FP8 checkpoint)" if row["fp8_checkpoint"] else "") +
                 f"; KV {row['kv_bytes_per_token'] / 1024:.0f} KiB a token ({kv}, one GPU)")
    lines.append(f"  {'option':<12} {'weights/GPU':>12} {'KV/GPU':>10} {'KV tokens':>11}  fits")
    for o in row["options"]:
        lines.append(f"  TP {o['tensor_parallel_size']:<2} {o['quantization']:<6} {o['weights_gib_per_gpu']:>8.1f} GiB "
                     f"{o['kv_gib_per_gpu']:>6.1f} GiB {o['kv_tokens']:>11,}  {'yes' if o['fits'] else 'no'}")
    plan = row["plan"]
    if plan is None:
        lines.append(f"  plan: does not fit on {args.gpus} x {args.gpu_memory:g} GiB: {row['why']}")
    else:
        flags = " ".join(plan["flags"]) or "no flags"
        lines.append(f"  plan: TP {plan['tensor_parallel_size']} {plan['quantization']} ({flags}): "
                     f"{plan['kv_tokens']:,} KV tokens left ({plan['kv_tokens'] / need:.1f}x the {need:,} asked)")
    return "\n".join(lines)


def cmd_plan(args):
    check_args(args)
    need = args.max_num_seqs * args.max_model_len
    rows = [plan_one(model_facts(name), args) for name in args.models]  # an unknown model: a ValueError
    if args.json:
        print(json.dumps({"gpus": args.gpus, "gpu_memory_gib": args.gpu_memory, "memory_fraction": args.memory_fraction,
                          "activation_reserve_gib": ACTIVATION_RESERVE_GIB, "max_num_seqs": args.max_num_seqs,
                          "max_model_len": args.max_model_len, "needed_kv_tokens": need,
                          "kv_cache_dtype": args.kv_cache_dtype, "kv_bytes": KV_DTYPES[args.kv_cache_dtype],
                          "models": rows}, indent=1))
        return 0
    print(f"{args.gpus} x {args.gpu_memory:g} GiB GPU{'s' if args.gpus > 1 else ''}, {args.memory_fraction:.0%} of "
          f"each used, {ACTIVATION_RESERVE_GIB:g} GiB of it reserved for activations; KV room needed for "
          f"{args.max_num_seqs} sequences x {args.max_model_len} tokens = {need:,} tokens")
    for row in rows:
        print()
        print(describe(row, args))
    print("\nrules: bf16 at the smallest TP that fits, else fp8 at the smallest (an FP8 checkpoint: fp8 only); "
          "TP sizes are powers of two dividing the heads; KV of sliding-window/chunked layers counted in full "
          "(byzantium plan --help)")
    return 0


COMMAND = Command("plan", "the tensor-parallel size and quantization each model needs on N GPUs, and the KV "
                          "tokens left (loads nothing)", add_plan_args, cmd_plan)
