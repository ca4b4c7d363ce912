#!/usr/bin/env bash
# GPU check for the attention kernels and the engine (issue 5). One run, under 6 minutes on an H200,
# no network, nothing installed (needs torch with CUDA, triton, transformers, pytest).
#
#   PYTHONPATH=. bash bench/gpu_check.sh
#
# 1. tests/test_kernels.py on CUDA: the Triton kernels against the torch reference in fp32, fp16, bf16,
#    and the engine's greedy tokens with the Triton backend against the torch backend;
# 2. attention microbenchmarks (bench/kernel_bench.py): decode GB/s vs a device-to-device copy,
#    append prefill TFLOP/s vs torch SDPA;
# 3. engine decode throughput (random Qwen3-0.6B-shaped model) at batch 1, 64, 256 vs transformers generate.
#
# Writes gpu_check.md into $OUT (bench/results/ when $OUT is unset) and prints it last.
# Extra arguments go to bench/gpu_check.py (e.g. --skip-tests).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network
unset TRITON_INTERPRET  # the kernels must run compiled on the GPU here
out_dir="${OUT:-bench/results}"
mkdir -p "$out_dir"

# A hard stop inside the 6-minute budget; the report is rewritten after every section, so whatever
# finished is still there if this fires.
timeout --signal=INT --kill-after=10 340 python bench/gpu_check.py --out "$out_dir" "$@" > "$out_dir/gpu_check.log" 2>&1
status=$?
if [ "$status" -ne 0 ]; then
    echo "bench/gpu_check.py exited with status $status (124: timed out); its log:"
    tail -n 40 "$out_dir/gpu_check.log"
    echo
fi
cat "$out_dir/gpu_check.md" 2>/dev/null || echo "no report was written"
exit "$status"
