"""`byzantium plan MODEL... [--gpus N] [--gpu-memory GiB] [--max-num-seqs S] [--max-model-len L]`: for each
model its weights in bf16 and fp8, the smallest tensor-parallel size and quantization that fit on N GPUs
with KV room for S x L tokens, and the KV tokens that plan leaves. Loads nothing, reads nothing from the
network and imports neither torch nor transformers itself.

The rules:
- TP sizes: powers of two up to --gpus that divide the attention heads, the experts (an engine rank holds
  whole experts) and the MLP widths, and that divide the K/V heads or are a multiple of them: with more
  ranks than K/V heads each rank keeps one replicated K/V head, so K/V heads per rank = max(1, kv_heads/tp).
- The choice (our reading of "the smallest TP and quantization"): bf16 at the smallest TP that fits;
  only when no TP up to --gpus fits in bf16, fp8 at the smallest TP that fits; else "does not fit".
  As vLLM users do, full precision on more GPUs is preferred over fp8 on fewer. A checkpoint whose
  config.json has an FP8 quantization_config (quant_method fp8, or compressed-tensors with 8-bit float
  weights) already is FP8: it is planned at fp8 only, and loads as FP8 without --quantization.
- Memory per GPU: --memory-fraction of it (default 0.9, as --memory-fraction / vLLM's
  gpu-memory-utilization), less the weights one rank holds, less an activation reserve of 2 GiB; the
  rest is KV cache. A plan fits when that KV cache holds S x L tokens.
- Weights per rank: the attention projections, MLPs and shared experts split over the ranks, routed
  experts dealt out whole, the embedding and the LM head split over the vocabulary (the last slice
  padded); norms, routers and biases replicated. fp8: those linears and the routed experts at one byte a
  weight plus a float32 scale a row (per-channel; per expert and row), everything else stays bf16. Only
  the text tower counts: the engine skips vision towers (their parameters are shown, not loaded). The
  arithmetic of one rank is engine/memory.py's, which LLMPool.plan sizes its engines with too.
- KV bytes per token per rank = 2 x layers x K/V heads per rank x head_dim x 2 (bf16; 1 with
  --kv-cache-dtype fp8). Layers with a sliding window (Gemma 3) or chunked attention (Llama 4) are
  counted as full attention: the plan is on the safe side for them.
- Approximate: the activation reserve is one number (the engine measures its own at start); parameter
  counts leave out vision towers' patch embeddings, projectors and biases (they land within ~1 % of
  the published totals); GPU memory is what CUDA reports (an H200 "141 GB": 139.8 GiB).

Model facts: config.json when the model is on this machine (a checkpoint directory, the embedded model
once converted, the Hugging Face cache), else a built-in table of the papers' models (facts.py).

    facts.py    a model's numbers: config.json here, or the built-in table
    fit.py      parameters, bytes per GPU, KV per token, TP sizes and the choice
    command.py  the `byzantium plan` command (a table per model, or --json)
"""
from .facts import BUILTIN, ModelFacts, model_facts
from .fit import (ACTIVATION_RESERVE_GIB, GIB, MEMORY_FRACTION, Option, kv_bytes_per_token, params, plan_model,
                  tp_sizes, weight_bytes)

__all__ = ["ACTIVATION_RESERVE_GIB", "BUILTIN", "GIB", "MEMORY_FRACTION", "ModelFacts", "Option", "kv_bytes_per_token",
           "model_facts", "params", "plan_model", "tp_sizes", "weight_bytes"]
