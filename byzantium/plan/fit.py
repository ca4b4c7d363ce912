"""The planner's arithmetic: parameters, weight bytes per GPU at a tensor-parallel size and weight dtype,
KV bytes per token, and the plan (the rules are in byzantium/plan/__init__.py). What one rank holds is
engine/memory.py's (rank_params, rank_weight_bytes, kv_bytes_per_token): LLMPool.plan sizes its engines
with the same arithmetic.

Approximate: biases of vision towers, patch embeddings and projectors are left out of the parameter
counts (they are not loaded anyway); the activation reserve is one number, not a measurement; layers
with a sliding window or chunked attention are counted as full attention (more KV than they hold).
"""
from dataclasses import dataclass

from ..engine import memory
from ..engine.memory import rank_params

GIB = 2**30
H200_GIB = 139.8  # one H200 ("141 GB" of HBM3e) as CUDA reports it: the default GPU of a plan
H200_GB = round(H200_GIB * GIB / 1e9, 1)  # the same in GB (1e9 bytes): the sweep's --device-memory default
MEMORY_FRACTION = 0.9  # the share of each GPU a plan uses (--memory-fraction; vLLM's gpu-memory-utilization)
DEFAULT_SEQS = 16  # sequences the KV cache must hold at full length (--max-num-seqs; the sweep's dry run)
ACTIVATION_RESERVE_GIB = 2.0  # per GPU, for a step's activations, CUDA graphs and collectives' buffers
QUANTIZATIONS = ("bf16", "fp8")  # weights: bf16 as the checkpoints store them; fp8 e4m3 with a scale per row
KV_DTYPES = {"auto": 2, "bf16": 2, "fp8": 1}  # bytes per K/V element (--kv-cache-dtype; auto: bf16)


def vision_params(facts):
    """The vision encoder's layers (attention and MLP weights; patch embedding and projector left out)."""
    if not facts.vision:
        return 0
    hidden, layers, intermediate, matrices = facts.vision
    return layers * (4 * hidden * hidden + matrices * hidden * intermediate)


def params(facts):
    """{"total": text + vision, "text": the text tower the engine loads, "active": a token's share (MoE)}."""
    p = rank_params(facts)
    text = p["linear"] + p["experts"] + p["kept"]
    active = text
    if facts.moe_layers:
        unused = facts.experts - facts.experts_per_token
        active -= facts.moe_layers * unused * 3 * facts.hidden * facts.expert_intermediate
    return {"total": text + vision_params(facts), "text": text, "active": active}


def weight_bytes(facts, quantization, tp=1):
    """Bytes of weights on each of `tp` ranks: bf16 everywhere, or FP8 decoder linears and routed experts
    (a byte a weight and a float32 scale a row) with the rest bf16 (engine/memory.py rank_weight_bytes)."""
    return memory.rank_weight_bytes(facts, tp, 1.0 if quantization == "fp8" else 0.0, 2)


def kv_bytes_per_token(facts, tp=1, kv_dtype="auto"):
    """K and V of one token on one rank: 2 x layers x K/V heads per rank x head_dim x bytes."""
    return memory.kv_bytes_per_token(facts, tp, KV_DTYPES[kv_dtype])


def tp_sizes(facts, gpus):
    """Tensor-parallel sizes the model splits into on `gpus`: powers of two up to it that divide the
    attention heads, the experts (dealt out whole) and the MLP widths, and that divide the K/V heads or
    are a multiple of them (K/V heads replicated)."""
    sizes, tp = [], 1
    while tp <= gpus:
        widths = [w for w in (facts.intermediate if facts.layers > facts.moe_layers else 0,
                              facts.shared_intermediate) if w]
        if (facts.heads % tp == 0 and (facts.kv_heads % tp == 0 or tp % facts.kv_heads == 0)
                and (not facts.experts or facts.experts % tp == 0) and all(w % tp == 0 for w in widths)):
            sizes.append(tp)
        tp *= 2
    return sizes


@dataclass(frozen=True)
class Option:
    tp: int
    quantization: str  # "bf16" or "fp8"
    weights: int  # bytes per GPU
    kv_bytes: int  # bytes per GPU left for the KV cache (negative: the weights do not fit)
    kv_tokens: int  # tokens the KV cache holds
    fits: bool  # the KV cache holds the tokens asked for

    def flags(self, facts):
        """The engine flags of this plan (an FP8 checkpoint loads as FP8 without --quantization)."""
        out = ["--tensor-parallel-size", str(self.tp)] if self.tp > 1 else []
        if self.quantization == "fp8" and not facts.fp8_checkpoint:
            out += ["--quantization", "fp8"]
        return out

    def label(self):
        return f"TP {self.tp} {self.quantization}"


def option(facts, tp, quantization, gpu_bytes, need_tokens, fraction=MEMORY_FRACTION, kv_dtype="auto",
           reserve=ACTIVATION_RESERVE_GIB * GIB):
    """One (tp, quantization) on GPUs of gpu_bytes: what is left for KV and how many tokens it holds."""
    weights = weight_bytes(facts, quantization, tp)
    left = int(fraction * gpu_bytes - weights - reserve)
    tokens = max(left, 0) // kv_bytes_per_token(facts, tp, kv_dtype)
    return Option(tp, quantization, weights, left, tokens, left > 0 and tokens >= need_tokens)


def options(facts, gpus, gpu_bytes, need_tokens, fraction=MEMORY_FRACTION, kv_dtype="auto", fp8=True):
    """Every (tp, quantization) the model may use on `gpus`, in the order the plan prefers them: bf16 at
    each TP size, smallest first, then fp8 likewise. An FP8 checkpoint: fp8 only; fp8=False: bf16 only."""
    kinds = (["fp8"] if fp8 else []) if facts.fp8_checkpoint else ["bf16", "fp8"] if fp8 else ["bf16"]
    return [option(facts, tp, q, gpu_bytes, need_tokens, fraction, kv_dtype)
            for q in kinds for tp in tp_sizes(facts, gpus)]


def choose(opts):
    """The plan: the first option that fits (bf16 at the smallest TP, else fp8 at the smallest); None."""
    return next((o for o in opts if o.fits), None)


def plan_model(facts, gpus, gpu_bytes, need_tokens, fraction=MEMORY_FRACTION, kv_dtype="auto", fp8=True):
    """(every option, the chosen one or None)."""
    opts = options(facts, gpus, gpu_bytes, need_tokens, fraction, kv_dtype, fp8)
    return opts, choose(opts)
