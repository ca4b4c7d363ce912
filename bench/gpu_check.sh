#!/usr/bin/env bash
# GPU check for the attention kernels and the engine (issues 5 and 14). No network, nothing installed
# (needs torch with CUDA, triton, transformers, pytest). Each part runs under its own hard stop (1: 340 s;
# 2: 180 + 300 s; 3: 240 s), so the whole can take up to 18 minutes: skip parts to fit a device budget.
#
#   PYTHONPATH=. bash bench/gpu_check.sh [--skip-check] [--skip-step] [--skip-parity] [gpu_check.py args]
#
# 1. bench/gpu_check.py (--skip-check leaves it out): tests/test_kernels.py on CUDA (the Triton kernels
#    against the torch reference in fp32, fp16, bf16; the engine's greedy tokens, Triton vs torch backend),
#    attention microbenchmarks (bench/kernel_bench.py), engine decode throughput vs transformers generate.
#    Writes gpu_check.md.
# 2. The lean CUDA step (issue 14; --skip-step): tests/test_cuda_step.py, tests/test_device_sampling.py and
#    tests/test_speculation.py (drafts verified in a step, identical contexts computed once; speculation
#    stays off by default on CUDA until these pass there) on CUDA, then bench/cuda_step.py: decode tok/s
#    eager vs CUDA graphs at batch 1, 64, 256 vs transformers generate and the card's HBM peak, prefill
#    TFLOP/s vs its bf16 peak, host syncs per decode step, two models planned onto one GPU (LLMPool.plan).
#    Appends to gpu.md.
# 3. Parity of the newer architectures (--skip-parity): their tests run on CUDA when torch sees one.
#
# Reports go to $OUT (bench/results/ when $OUT is unset); all of them are printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network
unset TRITON_INTERPRET  # the kernels must run compiled on the GPU here
out_dir="${OUT:-bench/results}"
mkdir -p "$out_dir"

run_check=1 run_step=1 run_parity=1
check_args=()
for arg in "$@"; do
    case "$arg" in
        --skip-check) run_check=0 ;;
        --skip-step) run_step=0 ;;
        --skip-parity) run_parity=0 ;;
        *) check_args+=("$arg") ;;
    esac
done
status=0

# Runs "$@" under a hard stop of $1 seconds, its output in $2; on failure shows the log's tail.
stage() {
    local limit="$1" log="$2"
    shift 2
    timeout --signal=INT --kill-after=10 "$limit" "$@" > "$log" 2>&1
    local code=$?
    if [ "$code" -ne 0 ]; then
        echo "$* exited with status $code (124: timed out); its log ($log):"
        tail -n 40 "$log"
        echo
        status=1
    fi
}

if [ "$run_check" -eq 1 ]; then
    # The report is rewritten after every section, so whatever finished is kept if the stop fires.
    stage 340 "$out_dir/gpu_check.log" python bench/gpu_check.py --out "$out_dir" ${check_args[@]+"${check_args[@]}"}
fi

if [ "$run_step" -eq 1 ]; then
    # The step's own tests on CUDA: real graphs vs eager, the Triton kernels on graph-shaped metadata, the
    # device sampler on CUDA tensors, speculation and riding (on the CPU they run in the normal test suite).
    stage 180 "$out_dir/cuda_step_tests.log" python -m pytest -q -p no:cacheprovider tests/test_cuda_step.py \
        tests/test_device_sampling.py tests/test_speculation.py
    echo "## CUDA step tests (tests/test_cuda_step.py tests/test_device_sampling.py tests/test_speculation.py)"
    tail -n 5 "$out_dir/cuda_step_tests.log"
    echo
    stage 300 "$out_dir/cuda_step.log" python bench/cuda_step.py --out "$out_dir"
fi

if [ "$run_parity" -eq 1 ]; then
    # >>> parity hooks for new architectures: Qwen3-MoE, Gemma 3, Mistral 3 (each file runs once it exists)
    parity=()
    for test_file in tests/test_moe.py tests/test_gemma3.py tests/test_mistral3.py; do
        [ -f "$test_file" ] && parity+=("$test_file")
    done
    if [ "${#parity[@]}" -gt 0 ]; then
        stage 240 "$out_dir/parity.log" python -m pytest -q -p no:cacheprovider "${parity[@]}"
        echo "## Parity tests on CUDA (${parity[*]})"
        tail -n 5 "$out_dir/parity.log"
        echo
    fi
    # <<< parity hooks
fi

[ "$run_check" -eq 1 ] && { cat "$out_dir/gpu_check.md" 2>/dev/null || echo "no gpu_check report was written"; }
[ "$run_step" -eq 1 ] && { cat "$out_dir/gpu.md" 2>/dev/null || echo "no cuda_step report was written"; }
exit "$status"
