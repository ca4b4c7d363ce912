"""Microbenchmarks of the attention kernels over the paged KV cache.

- decode: achieved GB/s (K/V bytes read / time) against a measured device-to-device copy, the
  practical bandwidth bound (decode attention reads every cached K/V byte once and does little math);
- append prefill: achieved TFLOP/s against torch SDPA on the same shapes (dense, unpaged K/V, bottom-right
  causal mask), the ceiling a paged kernel is chasing.

    PYTHONPATH=. python bench/kernel_bench.py            # CUDA, bf16: prints markdown tables
    PYTHONPATH=. python bench/kernel_bench.py --smoke    # tiny shapes on CPU: checks this script runs
    PYTHONPATH=. python bench/kernel_bench.py --cpu      # CPU fp32, SmolLM2's shapes: decode attention
                                                         # (torch vs cpu) and linears (oneDNN vs the panels)

Qwen3-0.6B's attention shape by default: 16 query heads, 8 KV heads, head_dim 128, block size 16.
"""
import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from byzantium.kernels import attention_ops

RESULTS = Path(__file__).parent / "results"
# (batch, context) for decode; (batch, cached prefix, new tokens) for append prefill.
DECODE_SHAPES = [(1, 4096), (1, 32768), (16, 8192), (64, 2048), (256, 1024), (256, 4096)]
PREFILL_SHAPES = [(1, 0, 4096), (8, 0, 1024), (4, 2048, 1024), (32, 1024, 128), (64, 1536, 64)]
SMOKE_DECODE = [(1, 100), (3, 40)]
CPU_DECODE = [(1, 176), (8, 176), (32, 176), (64, 200), (32, 1024), (4, 8192)]
CPU_PREFILL = [(1, 0, 128), (8, 0, 128), (1, 0, 1024), (4, 0, 512), (4, 512, 64), (8, 1024, 16)]
SMOKE_PREFILL = [(1, 0, 33), (2, 20, 7)]


def bench(fn, device, warmup=5, rep=20):
    """Median seconds of fn(); CUDA events on GPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(rep):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(rep):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(device, nbytes=2**30):
    """GB/s of a device-to-device copy (bytes read + bytes written)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = bench(lambda: dst.copy_(src), device)
    return 2 * nbytes / seconds / 1e9


def paged_cache(batch, context, num_kv_heads, head_dim, block_size, dtype, device, gen):
    """Random K/V for `batch` sequences of `context` tokens, their blocks scattered by a permutation."""
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq + 1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    perm = torch.randperm(num_blocks - 1, generator=gen, device=device) + 1
    block_tables = perm[:batch * blocks_per_seq].view(batch, blocks_per_seq).to(torch.int32)
    return k_cache, v_cache, block_tables


def decode_rows(backends, shapes, dtype, device, num_heads=16, num_kv_heads=8, head_dim=128, block_size=16,
                copy_gbps=None):
    gen = torch.Generator(device).manual_seed(0)
    rows = []
    for batch, context in shapes:
        k_cache, v_cache, block_tables = paged_cache(batch, context, num_kv_heads, head_dim, block_size,
                                                     dtype, device, gen)
        q = torch.randn(batch, num_heads, head_dim, generator=gen, device=device, dtype=torch.float32).to(dtype)
        seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        kv_bytes = 2 * batch * context * num_kv_heads * head_dim * k_cache.element_size()
        row = {"batch": batch, "context": context, "KV MB": kv_bytes / 1e6}
        for name, ops in backends.items():
            try:
                s = bench(lambda: ops.paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables,
                                                             head_dim ** -0.5), device)
                row[f"{name} us"] = s * 1e6
                row[f"{name} GB/s"] = kv_bytes / s / 1e9
                if copy_gbps:
                    row[f"{name} % of copy"] = 100 * kv_bytes / s / 1e9 / copy_gbps
            except RuntimeError as e:  # e.g. out of memory (a CUDA OOM is a RuntimeError)
                row[f"{name} us"] = f"failed: {type(e).__name__}"
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
    return rows


def prefill_flops(batch, prefix, new, num_heads, head_dim):
    """Causal QK^T and PV flops: new token j attends to prefix + j + 1 keys."""
    keys = batch * (new * prefix + new * (new + 1) / 2)
    return 4 * keys * num_heads * head_dim


def prefill_rows(backends, shapes, dtype, device, num_heads=16, num_kv_heads=8, head_dim=128, block_size=16):
    gen = torch.Generator(device).manual_seed(1)
    rows = []
    scale = head_dim ** -0.5
    for batch, prefix, new in shapes:
        total = prefix + new
        k_cache, v_cache, block_tables = paged_cache(batch, total, num_kv_heads, head_dim, block_size,
                                                     dtype, device, gen)
        q = torch.randn(batch * new, num_heads, head_dim, generator=gen, device=device,
                        dtype=torch.float32).to(dtype)
        cu_seqlens_q = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device=device)
        seq_lens = torch.full((batch,), total, dtype=torch.int32, device=device)
        flops = prefill_flops(batch, prefix, new, num_heads, head_dim)
        row = {"batch": batch, "prefix": prefix, "new": new, "GFLOP": flops / 1e9}

        # SDPA on the same data, unpaged and with K/V repeated per query head (not timed): the dense
        # attention a paged kernel is measured against. Bottom-right causal = new token j sees prefix + j.
        group = num_heads // num_kv_heads
        k = k_cache[block_tables.long()].flatten(1, 2)[:, :total].repeat_interleave(group, 2).transpose(1, 2)
        v = v_cache[block_tables.long()].flatten(1, 2)[:, :total].repeat_interleave(group, 2).transpose(1, 2)
        qd = q.view(batch, new, num_heads, head_dim).transpose(1, 2)
        if prefix == 0:
            sdpa = lambda: F.scaled_dot_product_attention(qd, k, v, is_causal=True, scale=scale)  # noqa: E731
        else:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(new, total)
            sdpa = lambda: F.scaled_dot_product_attention(qd, k, v, attn_mask=mask, scale=scale)  # noqa: E731
        s = bench(sdpa, device)
        row["sdpa ms"], row["sdpa TFLOP/s"] = s * 1e3, flops / s / 1e12
        for name, ops in backends.items():
            try:
                s = bench(lambda: ops.append_prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens,
                                                               block_tables, scale), device)
                row[f"{name} ms"], row[f"{name} TFLOP/s"] = s * 1e3, flops / s / 1e12
                row[f"{name} / sdpa"] = row["sdpa ms"] / row[f"{name} ms"]
            except RuntimeError as e:
                row[f"{name} ms"] = f"failed: {type(e).__name__}"
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
    return rows


def markdown(rows, title=None):
    """A markdown table of dict rows (union of their keys, in first-seen order)."""
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]

    def fmt(x):
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
        return "" if x is None else str(x)

    lines = [f"### {title}", ""] if title else []
    lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def run(device, dtype, smoke=False, backends=("triton",)):
    """(markdown sections for the decode and prefill benchmarks, copy GB/s)."""
    device = torch.device(device)
    ops = {name: attention_ops(name) for name in backends}
    sections = []
    copy_gbps = copy_bandwidth(device, 2**24 if smoke else 2**30)
    sections.append(f"Device-to-device copy: {copy_gbps:.0f} GB/s (read + write)\n")
    decode = decode_rows(ops, SMOKE_DECODE if smoke else DECODE_SHAPES, dtype, device, copy_gbps=copy_gbps)
    sections.append(markdown(decode, f"Paged decode attention ({dtype_name(dtype)}, Hq 16, Hkv 8, D 128, block 16)"))
    prefill = prefill_rows(ops, SMOKE_PREFILL if smoke else PREFILL_SHAPES, dtype, device)
    sections.append(markdown(prefill, f"Append prefill attention ({dtype_name(dtype)}, causal, vs SDPA on the same shapes)"))
    return sections, copy_gbps


def linear_rows(dtype=torch.float32, row_counts=(1, 4, 8, 16, 32, 64, 256), layers=30):
    """The decoder layers' linears of SmolLM2-135M (qkv, o, gate_up, down) for `layers` distinct layers, so
    the weights stream from memory as in a real step, on every kernel the linear choice times here for
    `dtype` (oneDNN prepacked, the panels, the AVX-512 and bf16 panels where the CPU has them)."""
    from byzantium.kernels import cpu_ext
    from byzantium.kernels.linear_choice import Torch, candidates
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    kernels = [c for c in candidates(cpu_ext.load(), True, dtype) if not isinstance(c, Torch)]
    weights = [[(torch.randn(n, k) * 0.05).to(dtype) for n, k in shapes] for _ in range(layers)]
    packed = {c.name: [[c.pack(w) for w in layer] for layer in weights] for c in kernels}
    del weights
    rows = []
    for m in row_counts:
        xs = [torch.randn(m, k).to(dtype) for _, k in shapes]
        flops = 2 * m * sum(n * k for n, k in shapes) * layers
        row = {"rows": m}
        for c in kernels:
            def run_kernel(c=c):
                for layer in packed[c.name]:
                    for (n, _), w, x in zip(shapes, layer, xs):
                        c.run(x, w, None, n)
            seconds = bench(run_kernel, torch.device("cpu"), 1, 5)
            row[f"{c.name} ms"], row[f"{c.name} GFLOP/s"] = seconds * 1e3, flops / seconds / 1e9
        if "onednn ms" in row:
            best = min((k for k in row if k.endswith(" ms") and k != "onednn ms"), key=row.get, default=None)
            if best:
                row["best panels vs oneDNN"] = row["onednn ms"] / row[best]
        rows.append(row)
    return rows


class Avx2Decode:
    """The cpu backend with its decode kernel held to cpu_attention.cpp (AVX2), as on CPUs without AVX-512."""

    @staticmethod
    def paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale):
        from byzantium.kernels import cpu_ext
        return cpu_ext.load().paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, scale, avx512=False)


def run_cpu(backends=("torch", "cpu")):
    """Decode and prefill attention with SmolLM2-135M's heads (9 query, 3 KV, head_dim 64) and its
    linears, fp32."""
    device = torch.device("cpu")
    ops = {name: attention_ops(name) for name in backends}
    decode_ops = dict(ops, **({"cpu avx2": Avx2Decode} if "cpu" in ops else {}))
    rows = decode_rows(decode_ops, CPU_DECODE, torch.float32, device, num_heads=9, num_kv_heads=3, head_dim=64)
    for row in rows:
        if "torch us" in row and "cpu us" in row:
            row["cpu speed-up"] = row["torch us"] / row["cpu us"]
    prefill = prefill_rows(ops, CPU_PREFILL, torch.float32, device, num_heads=9, num_kv_heads=3, head_dim=64)
    for row in prefill:
        for key in [k for k in row if k.endswith("TFLOP/s")]:
            row[key.replace("TFLOP/s", "GFLOP/s")] = row.pop(key) * 1e3
    threads = torch.get_num_threads()
    return [markdown(rows, f"Paged decode attention on CPU (float32, Hq 9, Hkv 3, D 64, block 16, {threads} threads)"),
            markdown(prefill, f"Prefill attention on CPU: prompts and appends to a cached prefix (float32, Hq 9, "
                              f"Hkv 3, D 64, block 16, {threads} threads; sdpa: dense, unpaged, not what the torch "
                              f"backend runs)"),
            markdown(linear_rows(), f"SmolLM2-135M's 120 decoder-layer linears, weights streamed from memory "
                                    f"(float32, {threads} threads)"),
            markdown(linear_rows(torch.bfloat16), f"The same linears in bfloat16 ({threads} threads)")]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform
        return platform.processor() or platform.machine()


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU with the torch reference")
    parser.add_argument("--cpu", action="store_true", help="CPU fp32 decode with SmolLM2's heads: torch vs cpu")
    parser.add_argument("--backends", default=None, help="comma-separated: triton,torch,cpu,flash_attn")
    args = parser.parse_args()
    if args.cpu:
        sections = run_cpu(tuple((args.backends or "torch,cpu").split(",")))
        Path(RESULTS).mkdir(exist_ok=True)
        path = Path(RESULTS) / "cpu_kernels.md"
        if not path.exists():
            path.write_text("# CPU kernels (`python bench/kernel_bench.py --cpu`)\n")
        with path.open("a") as f:  # a dated entry per run: the history stays
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {cpu_model()}, torch {torch.__version__}\n\n"
                    + "\n".join(sections))
    elif args.smoke:
        sections, _ = run("cpu", torch.float32, smoke=True, backends=(args.backends or "torch").split(","))
    else:
        sections, _ = run("cuda", torch.bfloat16, backends=(args.backends or "triton,torch").split(","))
    print("\n".join(sections))


if __name__ == "__main__":
    main()
