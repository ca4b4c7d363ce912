#!/usr/bin/env bash
# The GPU check, in parts that fit the time a device is lent (15 minutes in all, start-up included).
# No network, nothing installed (needs torch with CUDA, triton, transformers; pytest for parts 1, 3, 5, 8:
# where the machine lacks it, carry it in .device-site, made here by `make device-site`).
#
#   bash bench/gpu_check.sh                       # the default plan (parts 1-6, stops adding up to 390 s)
#   bash bench/gpu_check.sh --budget 600          # the parts that fit in 600 s, in order of value
#   bash bench/gpu_check.sh --part 1 --part 3     # those parts
#   bash bench/gpu_check.sh --plan                # which parts would run; runs nothing
#   bash bench/gpu_check.sh --smoke               # each part's CPU variant: checks the script itself
#
# Parts (bench/gpu_parts.py), each under its own hard stop: 1 Triton kernels vs the reference (incl. FP8 KV,
# MoE, FP8 MoE); 2 engine parity and decode throughput vs transformers; 3 CUDA graphs and device sampling;
# 4 the FP8 linear; 5 Llama 4, Qwen3-MoE, Gemma 3, Mistral 3 on CUDA; 6 batch drift; then, past the default
# budget, 7 the CUDA step bench and 8 tensor parallelism on two GPUs. Everything lands in two files of $OUT
# (default bench/results), appended as each part ends: gpu_check.json and gpu_check.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
if [[ -d .device-site ]]; then PYTHONPATH="$PYTHONPATH:$PWD/.device-site"; fi  # carried pure-Python wheels
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network
export BYZANTIUM_CPU_KERNELS=off  # no C++ CPU-kernel build: collecting the kernel tests would start one
if [[ " $* " != *" --smoke "* ]]; then
    unset TRITON_INTERPRET  # the kernels must run compiled on the GPU
fi
exec "${PYTHON:-python3}" bench/gpu_parts.py "$@"
