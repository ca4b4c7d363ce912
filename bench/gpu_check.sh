#!/usr/bin/env bash
# The GPU check, in parts that fit the time a device is lent (15 minutes in all, start-up included).
# No network, nothing installed (needs torch with CUDA, triton, transformers; pytest for parts 1, 4, 6).
#
#   bash bench/gpu_check.sh --budget 600          # the parts that fit in 600 s, in order of value
#   bash bench/gpu_check.sh --part 1 --part 3     # those parts
#   bash bench/gpu_check.sh --budget 600 --plan   # which parts would run; runs nothing
#   bash bench/gpu_check.sh --smoke               # each part's CPU variant: checks the script itself
#
# Parts (bench/gpu_parts.py), each under its own hard stop: 1 Triton kernels vs the reference; 2 engine
# parity and decode throughput vs transformers; 3 batch invariance and per-engine memory; 4 CUDA graphs,
# device sampling and speculation tests; 5 the CUDA step bench; 6 parity of the newer architectures;
# 7 tensor parallelism on two GPUs (skipped, and said, on one), FP8 and Llama 4 on CUDA; 8 the FP8 linear.
# Each writes $OUT/gpu_part<N>.{log,json} and a verdict line in $OUT/gpu_verdicts.txt as it ends
# ($OUT defaults to bench/results).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network
if [[ " $* " != *" --smoke "* ]]; then
    unset TRITON_INTERPRET  # the kernels must run compiled on the GPU
fi
exec "${PYTHON:-python}" bench/gpu_parts.py "$@"
