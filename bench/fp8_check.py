"""FP8 linear check for a GPU run (bench/gpu_check.sh): Fp8Linear (layers/fp8.py) against bf16 F.linear at
a 70B layer's shapes, batch 1 and 256. Prints, per shape and batch, which path ran (torch._scaled_mm with
per-token activation scales on compute capability >= 8.9, else the tile-wise dequantizing fallback), the
relative error against bf16 F.linear on the unquantized weight and against the dequantized weight, and
the time of each. Exits 1 when an error is past --max-rel-err.

    python bench/fp8_check.py                         # 8192->28672 (gate/up) and 28672->8192 (down)
    python bench/fp8_check.py --device cpu --shapes 512x1024 --batches 1,8   # a smoke run without a GPU
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from byzantium.engine.layers import fp8


def timed(fn, iters, device):
    """Median seconds of fn() over `iters` runs, after warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def rel_err(a, b):
    return ((a.float() - b.float()).norm(dim=-1) / b.float().norm(dim=-1)).max().item()


def check(in_features, out_features, batch, device, iters):
    g = torch.Generator(device=device).manual_seed(0)
    weight = (torch.randn(out_features, in_features, generator=g, device=device) * 0.02).bfloat16()
    linear = fp8.Fp8Linear(in_features, out_features, bias=False, dtype=torch.bfloat16, device=device)
    q, scale = fp8.quantize_rows(weight)
    with torch.no_grad():
        linear.weight.copy_(q)
        linear.weight_scale.copy_(scale)
    x = torch.randn(batch, in_features, generator=g, device=device).bfloat16()
    with torch.no_grad():
        path = "scaled_mm" if fp8._scaled_mm_ok(x, out_features) else "dequantize"
        out = linear(x)
        exact = F.linear(x, weight)
        dequantized = fp8.dequantized_linear(x, linear.weight, linear.weight_scale)
        t_fp8 = timed(lambda: linear(x), iters, device)
        t_bf16 = timed(lambda: F.linear(x, weight), iters, device)
    flops = 2 * batch * in_features * out_features
    return dict(shape=f"{in_features}->{out_features}", batch=batch, path=path, err_vs_bf16=rel_err(out, exact),
                err_vs_dequantized=rel_err(out, dequantized), fp8_ms=t_fp8 * 1e3, bf16_ms=t_bf16 * 1e3,
                fp8_tflops=flops / t_fp8 / 1e12, bf16_tflops=flops / t_bf16 / 1e12, speedup=t_bf16 / t_fp8)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="8192x28672,28672x8192", help="INxOUT,... (Llama 70B's MLP)")
    parser.add_argument("--batches", default="1,256")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", default=None, help="write the rows to OUT/fp8_check.json too")
    parser.add_argument("--max-rel-err", type=float, default=0.06,
                        help="against bf16 F.linear: e4m3 weights and activations, ~3-4%% expected")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("fp8_check: no CUDA device; nothing checked (--device cpu for a smoke run)")
        return 0
    if device.type == "cuda":
        print(f"fp8_check: {torch.cuda.get_device_name(device)}, compute capability "
              f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}, torch {torch.__version__}")
    failed, rows = False, []
    for shape in args.shapes.split(","):
        in_features, out_features = map(int, shape.split("x"))
        for batch in map(int, args.batches.split(",")):
            r = check(in_features, out_features, batch, device, args.iters)
            rows.append(r)
            bad = r["err_vs_bf16"] > args.max_rel_err
            failed |= bad
            print(f"{r['shape']:>12} batch {r['batch']:>4} {r['path']:>10}: rel err vs bf16 {r['err_vs_bf16']:.4f}, "
                  f"vs dequantized {r['err_vs_dequantized']:.4f} | fp8 {r['fp8_ms']:.3f} ms ({r['fp8_tflops']:.1f} TFLOP/s)"
                  f" bf16 {r['bf16_ms']:.3f} ms ({r['bf16_tflops']:.1f} TFLOP/s) x{r['speedup']:.2f}"
                  f"{'  FAIL' if bad else ''}")
    print("fp8_check:", "FAIL" if failed else "OK")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fp8_check.json"), "w") as f:
            json.dump({"device": str(device), "iters": args.iters, "max_rel_err": args.max_rel_err, "rows": rows,
                       "ok": not failed}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
