"""Compile every Triton kernel launch the engine makes for sm_90, sm_89 and sm_80, with no GPU, and table
shared memory, registers and spills per specialisation (byzantium/kernels/aot.py).

    python bench/triton_aot.py [--arch 90 --arch 89 --arch 80] [--out bench/results/triton_aot.md]

Appends a dated section to --out (and prints it).
"""
import argparse
import datetime
import platform
import time
import warnings

import triton

from byzantium.kernels import aot


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, action="append", help="compute capability x10 (default 90, 89 and 80)")
    ap.add_argument("--out", default="bench/results/triton_aot.md")
    args = ap.parse_args()
    arches = args.arch or [90, 89, 80]
    warnings.simplefilter("ignore")
    lines = [f"\n## {datetime.date.today()}, triton {triton.__version__}, compiled on {platform.machine()} (no GPU)\n",
             "| arch | specialisation | kernel | warps | shared bytes | registers | spills (store/load bytes) |",
             "|---|---|---|---|---|---|---|"]
    bad, start = 0, time.perf_counter()
    for arch in arches:
        for label, launch in aot.specializations(full=True, arch=arch):
            with aot.offline_target(arch) as compiled:
                launch()
            for c in compiled:
                u = aot.usage(c)
                over = u["shared"] > aot.SHARED_LIMIT[arch]
                spill = u["spill_stores"] + u["spill_loads"] > 0
                bad += over or spill
                lines.append(f"| sm_{arch} | {label} | {c.name} | {u['num_warps']} | {u['shared']}{' OVER' if over else ''} "
                             f"| {u['registers']} | {u['spill_stores']}/{u['spill_loads']}{' SPILLS' if spill else ''} |")
    lines.append(f"\n{bad} specialisations over the shared-memory limit or spilling; "
                 f"{time.perf_counter() - start:.0f} s (`python bench/triton_aot.py`; CPU: {cpu_model()}).\n")
    text = "\n".join(lines)
    print(text)
    with open(args.out, "a") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
