"""The lean CUDA step (issue 14), measured: decode with and without CUDA graphs, prefill, host syncs,
and two models planned onto one GPU.

1. Decode tok/s at batch 1, 64, 256 on a random Qwen3-0.6B-shaped model (built from a config: nothing is
   downloaded), engine eager (enforce_eager=True) and with CUDA graphs, against transformers `generate`
   on the same weights and against the card: achieved bytes/s of a decode step (every weight once, plus
   the K/V of every sequence) / the HBM peak and / a measured device-to-device copy.
2. Prefill TFLOP/s (matmuls + causal attention) against the card's dense bf16 peak.
3. Host syncs per pure decode step (torch.cuda.set_sync_debug_mode): the step is built to make one.
4. Memory planning of two models on one GPU: LLMPool(...).plan([a, b]), both engines loaded and run;
   each engine's `memory`; the process must stay under 0.9 of the device.

Prints markdown and appends it to bench/results/gpu.md (date and GPU name in the heading).

    PYTHONPATH=. python bench/cuda_step.py            # CUDA (bench/gpu_check.sh part 5 runs it)
    PYTHONPATH=. python bench/cuda_step.py --smoke    # CPU, tiny model: checks this script runs
"""
import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_bench  # noqa: E402  (bench/ is not a package)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                 rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
            tie_word_embeddings=True)
# Datasheet peaks: (HBM bytes/s, dense bf16 FLOP/s), matched against torch's device name in this order.
CARDS = [("H200", 4.8e12, 989e12), ("H100 NVL", 3.9e12, 835e12), ("H100 PCIe", 2.0e12, 756e12),
         ("H100", 3.35e12, 989e12), ("A100-SXM4-80GB", 2.039e12, 312e12), ("A100 80GB PCIe", 1.935e12, 312e12),
         ("A100", 1.555e12, 312e12), ("L40S", 0.864e12, 362e12), ("RTX 4090", 1.008e12, 165e12),
         ("L4", 0.3e12, 121e12)]


def card_limits(device):
    """(name, HBM bytes/s or None, bf16 FLOP/s or None)."""
    if device.type != "cuda":
        return "cpu", None, None
    name = torch.cuda.get_device_name(device)
    for key, hbm, flops in CARDS:
        if key in name:
            return name, hbm, flops
    return name, None, None


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_model(shape, directory, device, dtype):
    """A random Qwen3 model of this shape saved into `directory` (safetensors, no tokenizer); returned for
    transformers generate."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)
    with torch.device(device):  # initialised on the GPU: seconds, not a minute on the CPU
        model = Qwen3ForCausalLM(Qwen3Config(**shape))
    model = model.to(dtype).eval()
    model.save_pretrained(directory)
    return model


def kv_bytes_per_token(shape, dtype):
    return 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * dtype.itemsize


def prefill_flops(shape, num_params, prompt_len):
    """FLOPs of one prompt's prefill: 2 per weight per token (the embedding is a lookup; the head runs on
    the last token only), plus causal attention (QK^T and PV: 4 * heads * head_dim per query-key pair)."""
    embed = shape["vocab_size"] * shape["hidden_size"]
    body = (num_params - embed) * 2 * prompt_len  # tied head: counted once, as the embedding
    head = 2 * embed
    attention = 4 * shape["num_hidden_layers"] * shape["num_attention_heads"] * shape["head_dim"] * prompt_len * (prompt_len + 1) / 2
    return body + head + attention


def random_prompts(batch, length, vocab, generator):
    return torch.randint(0, vocab, (batch, length), generator=generator).tolist()


def engine_decode(engine, prompts, gen):
    """(median seconds of a pure decode step, decode tok/s) from the engine's own step records."""
    from byzantium import SamplingParams
    engine.reset_stats()
    engine.generate(prompts, SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True))
    steps = [r for r in engine.step_records.records if r.phase == "decode"]
    seconds = statistics.median(r.ns for r in steps) / 1e9
    return seconds, engine.stats["decode_tok_per_s"]


def hf_decode(model, prompts, gen, device):
    """transformers generate, greedy: decode tok/s = (time of gen tokens - time of 1) per token."""
    ids = torch.tensor(prompts, device=device)
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)

    def timed(n):
        sync(device)
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
        sync(device)
        return time.perf_counter() - start

    with torch.inference_mode():
        timed(2)  # warm-up
        first, full = timed(1), timed(gen)
    return len(prompts) * (gen - 1) / max(full - first, 1e-9)


def syncs_per_step(engine, prompts, steps, device):
    """Host syncs torch reports (set_sync_debug_mode 'warn') per pure decode step, graphs captured."""
    from byzantium import SamplingParams
    if device.type != "cuda":
        return None
    seqs = engine.add_requests(prompts, SamplingParams(max_tokens=steps + 8, temperature=0.8, top_p=0.9, seed=1,
                                                       ignore_eos=True))
    for _ in range(4):  # the prefill, then decode steps until the bucket's graph is captured
        engine.step()
    sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for seq in seqs:
        engine.abort(seq)
    found = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
    return len(found) / steps, sorted(set(m.splitlines()[0][:120] for m in found))


def decode_section(device, dtype, shape, batches, prompt_len, gen, directory, model, copy_bps, limits):
    from byzantium import Engine
    _, hbm, _ = limits
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: counted once
    kv_token = kv_bytes_per_token(shape, dtype)
    num_blocks = max(batches) * -(-(prompt_len + gen + 16) // 16) + 64
    base = dict(model=directory, device=str(device), dtype=dtype, block_size=16, num_blocks=num_blocks,
                max_num_seqs=max(batches), max_batch_tokens=max(8192, max(batches)), max_model_len=prompt_len + gen + 16)
    generator = torch.Generator().manual_seed(0)
    rows, described, notes = [], {}, []
    for label, eager in (("eager", True), ("cuda graphs", False)):
        engine = Engine(**base, enforce_eager=eager)
        for batch in batches:
            engine_decode(engine, random_prompts(batch, prompt_len, shape["vocab_size"], generator), gen)  # warm-up
            seconds, tok_s = engine_decode(engine, random_prompts(batch, prompt_len, shape["vocab_size"], generator), gen)
            step_bytes = weight_bytes + batch * (prompt_len + gen / 2) * kv_token  # mean context over the run
            row = {"engine": label, "batch": batch, "step ms": seconds * 1e3, "decode tok/s": tok_s,
                   "GB/s": step_bytes / seconds / 1e9}
            if hbm:
                row["% HBM peak"] = 100 * step_bytes / seconds / hbm
            if copy_bps:
                row["% copy"] = 100 * step_bytes / seconds / copy_bps
            rows.append(row)
        described[label] = engine.describe()["cuda_graphs"]
        if not eager:
            counted = syncs_per_step(engine, random_prompts(8, prompt_len, shape["vocab_size"], generator), 16, device)
            if counted is not None:
                notes.append(f"Host syncs per pure decode step (graphs, 8 rows, top-p sampling): {counted[0]:.2f} "
                             f"(the step makes one: the sampler's read-back); reported as: {counted[1]}")
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    hf = {batch: hf_decode(model, random_prompts(batch, prompt_len, shape["vocab_size"], generator), gen, device)
          for batch in batches}
    eager = {r["batch"]: r["decode tok/s"] for r in rows if r["engine"] == "eager"}
    for row in rows:
        row["HF generate tok/s"] = hf[row["batch"]]
        row["x HF"] = row["decode tok/s"] / hf[row["batch"]]
        row["x eager"] = row["decode tok/s"] / eager[row["batch"]]
    note = (f"Random Qwen3 ({shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
            f"{weight_bytes / 1e9:.2f} GB of {kernel_bench.dtype_name(dtype)} weights), prompts of {prompt_len} random "
            f"ids, {gen} greedy tokens (ignore_eos). Step ms: median pure decode step (Engine step records, host "
            f"work included). GB/s: (weights + K/V of every sequence at the mean context) / step time. "
            f"CUDA graphs: {described.get('cuda graphs')}.\n\n")
    return note + kernel_bench.markdown(rows) + ("\n" + "\n".join(notes) + "\n" if notes else "")


def prefill_section(device, dtype, shape, directory, num_params, limits):
    from byzantium import Engine
    _, _, peak = limits
    prompt_len, count = (1024, 16) if device.type == "cuda" else (32, 4)
    engine = Engine(directory, device=str(device), dtype=dtype, num_blocks=count * (prompt_len // 16 + 2) * 2,
                    max_num_seqs=count, max_batch_tokens=8192 if device.type == "cuda" else 64,
                    max_model_len=prompt_len + 16, enforce_eager=True)
    generator = torch.Generator().manual_seed(1)
    engine.logits(random_prompts(count, prompt_len, shape["vocab_size"], generator))  # warm-up
    engine.reset_stats()
    engine.logits(random_prompts(count, prompt_len, shape["vocab_size"], generator))
    seconds = engine.stats["prefill_seconds"]
    flops = count * prefill_flops(shape, num_params, prompt_len)
    row = {"prompts": count, "tokens each": prompt_len, "prefill tok/s": count * prompt_len / seconds,
           "TFLOP/s": flops / seconds / 1e12}
    if peak:
        row["% bf16 peak"] = 100 * flops / seconds / peak
    del engine
    return (f"{count} random prompts of {prompt_len} tokens, no cache hits, steps of up to max_batch_tokens; FLOPs: "
            f"2 per weight per token + causal attention.\n\n" + kernel_bench.markdown([row]))


def memory_section(device, dtype, shapes, directory):
    """Two models of different sizes planned onto one device, loaded, and run."""
    from byzantium import LLMPool, SamplingParams
    dirs = []
    for i, shape in enumerate(shapes):
        path = os.path.join(directory, f"plan{i}")
        model = make_model(shape, path, device, dtype)
        del model
        dirs.append(path)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    fraction = 0.9
    pool = LLMPool(memory_fraction=fraction, device=str(device), dtype=dtype, max_model_len=2048)
    try:
        shares = pool.plan(dirs)
        engines = [pool.get(d).engine.engine for d in dirs]
        for engine in engines:
            engine.generate(random_prompts(16, 256, 100, torch.Generator().manual_seed(2)),
                            SamplingParams(max_tokens=16, ignore_eos=True))
        rows = []
        for d, engine in zip(dirs, engines):
            m = engine.memory
            share = next((v for k, v in shares.items() if os.path.samefile(k, d)), None)
            rows.append({"model": os.path.basename(d), "share": share, "weights GiB": m["weights_bytes"] / 2**30,
                         "KV GiB": m["kv_cache_bytes"] / 2**30, "KV blocks": m["kv_blocks"],
                         "activations (planning) GiB": (engine.activations_bytes or 0) / 2**30})
        body = kernel_bench.markdown(rows)
        if device.type == "cuda":
            sync(device)
            total = torch.cuda.get_device_properties(device).total_memory
            held = torch.cuda.max_memory_reserved(device)
            planned = sum(r["weights GiB"] + r["KV GiB"] + r["activations (planning) GiB"] for r in rows) * 2**30
            verdict = lambda n: "PASS" if n <= fraction * total else "FAIL"  # noqa: E731
            body += (f"\nDevice {total / 2**30:.1f} GiB, limit {100 * fraction:.0f}%. Sum of the engines (weights + "
                     f"KV + activations measured by planning): {planned / 2**30:.1f} GiB = {100 * planned / total:.1f}%: "
                     f"**{verdict(planned)}**. Peak reserved by this process after both ran (allocator caching "
                     f"included): {held / 2**30:.1f} GiB = {100 * held / total:.1f}%: **{verdict(held)}**\n")
        return body
    finally:
        pool.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model and shapes (checks the script)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"), help="gpu.md is appended here")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        device, dtype, shape, batches, prompt_len, gen = torch.device("cpu"), torch.float32, TINY, (1, 4), 8, 6
    else:
        if not torch.cuda.is_available():
            sys.exit("cuda_step: torch sees no CUDA device (use --smoke for a CPU check of this script)")
        device, dtype, shape, batches, prompt_len, gen = torch.device("cuda"), torch.bfloat16, QWEN3_06B, (1, 64, 256), 128, 128
    limits = card_limits(device)
    copy_bps = kernel_bench.copy_bandwidth(device, 2**24 if args.smoke else 2**30) * 1e9
    hbm, flops = limits[1], limits[2]
    sections = [f"## CUDA step ({time.strftime('%Y-%m-%d %H:%M')}, {limits[0]})\n",
                f"- torch {torch.__version__}; card peaks: HBM {hbm / 1e12 if hbm else '?'} TB/s, bf16 "
                f"{flops / 1e12 if flops else '?'} TFLOP/s (datasheet); device-to-device copy {copy_bps / 1e9:.0f} GB/s"
                f"{' (smoke run on the CPU: the numbers mean nothing)' if args.smoke else ''}\n"]

    def section(title, fn, *fn_args):
        start = time.perf_counter()
        try:
            body = fn(*fn_args)
        except Exception:  # the other sections are still worth having
            body = "FAILED:\n\n```\n" + traceback.format_exc()[-3000:] + "```\n"
        sections.append(f"### {title} ({time.perf_counter() - start:.0f} s)\n\n{body}")
        print(sections[-1], flush=True)

    print("\n".join(sections), flush=True)
    with tempfile.TemporaryDirectory() as directory:
        model = make_model(shape, directory, device, dtype)
        num_params = sum(p.numel() for p in model.parameters())
        section("Decode: eager vs CUDA graphs vs transformers generate", decode_section,
                device, dtype, shape, batches, prompt_len, gen, directory, model, copy_bps, limits)
        section("Prefill", prefill_section, device, dtype, shape, directory, num_params, limits)
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if not args.skip_memory:
            small = dict(shape, num_hidden_layers=max(1, shape["num_hidden_layers"] // 2))
            section("Two models planned onto one device (LLMPool.plan)", memory_section,
                    device, dtype, [shape, small], directory)
    name = "gpu_smoke.md" if args.smoke else "gpu.md"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name), "a") as f:
        f.write("\n".join(sections) + "\n")
    print(f"(appended to {os.path.join(args.out, name)})")


if __name__ == "__main__":
    main()
