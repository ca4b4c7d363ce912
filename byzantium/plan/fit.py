"""The planner's arithmetic: parameters, weight bytes per GPU at a tensor-parallel size and weight dtype,
KV bytes per token, and the plan (the rules are in byzantium/plan/__init__.py).

Approximate: biases of vision towers, patch embeddings and projectors are left out of the parameter
counts (they are not loaded anyway); the activation reserve is one number, not a measurement; layers
with a sliding window or chunked attention are counted as full attention (more KV than they hold).
"""
from dataclasses import dataclass

GIB = 2**30
H200_GIB = 139.8  # one H200 ("141 GB" of HBM3e) as CUDA reports it: the default GPU of a plan
MEMORY_FRACTION = 0.9  # the share of each GPU a plan uses (--memory-fraction; vLLM's gpu-memory-utilization)
DEFAULT_SEQS = 16  # sequences the KV cache must hold at full length (--max-num-seqs; the sweep's dry run)
ACTIVATION_RESERVE_GIB = 2.0  # per GPU, for a step's activations, CUDA graphs and collectives' buffers
QUANTIZATIONS = ("bf16", "fp8")  # weights: bf16 as the checkpoints store them; fp8 e4m3 with a scale per row
KV_DTYPES = {"auto": 2, "bf16": 2, "fp8": 1}  # bytes per K/V element (--kv-cache-dtype; auto: bf16)
SCALE_BYTES = 4  # an FP8 linear's scale per output row (float32)


def kv_heads_per_rank(facts, tp):
    """K/V heads each rank holds: its share, or one replicated head when ranks outnumber K/V heads."""
    return facts.kv_heads // tp if tp <= facts.kv_heads else 1


def rank_params(facts, tp=1):
    """Parameters one rank of `tp` holds: {"linear": in the linears FP8 quantizes (attention projections,
    MLPs, experts), "rows": those linears' output rows (one FP8 scale each), "kept": in what stays bf16
    (embedding and LM head, split over the vocabulary; norms, routers and biases, replicated)}."""
    f, h, d = facts, facts.hidden, facts.head_dim
    q, kv = f.heads // tp, kv_heads_per_rank(f, tp)
    linear = f.layers * (h * d * (q + 2 * kv) + q * d * h)
    rows = f.layers * (d * (q + 2 * kv) + h)
    kept = f.layers * (f.norms_per_layer * h + (2 * d if f.qk_norm else 0) + (d * (q + 2 * kv) if f.qkv_bias else 0))
    dense = f.layers - f.moe_layers
    if dense and f.intermediate:
        linear += dense * 3 * h * (f.intermediate // tp)
        rows += dense * (2 * (f.intermediate // tp) + h)
    if f.moe_layers:
        experts = f.experts // tp  # dealt out whole
        linear += f.moe_layers * experts * 3 * h * f.expert_intermediate
        rows += f.moe_layers * experts * (2 * f.expert_intermediate + h)
        kept += f.moe_layers * h * f.experts  # the router, replicated
        if f.shared_intermediate:
            linear += f.moe_layers * 3 * h * (f.shared_intermediate // tp)
            rows += f.moe_layers * (2 * (f.shared_intermediate // tp) + h)
    vocab = -(-f.vocab // tp)  # the last rank's slice padded
    kept += vocab * h * (1 if f.tied else 2) + h  # embedding, LM head, the final norm
    return {"linear": linear, "rows": rows, "kept": kept}


def vision_params(facts):
    """The vision encoder's layers (attention and MLP weights; patch embedding and projector left out)."""
    if not facts.vision:
        return 0
    hidden, layers, intermediate, matrices = facts.vision
    return layers * (4 * hidden * hidden + matrices * hidden * intermediate)


def params(facts):
    """{"total": text + vision, "text": the text tower the engine loads, "active": a token's share (MoE)}."""
    p = rank_params(facts)
    text = p["linear"] + p["kept"]
    active = text
    if facts.moe_layers:
        unused = facts.experts - facts.experts_per_token
        active -= facts.moe_layers * unused * 3 * facts.hidden * facts.expert_intermediate
    return {"total": text + vision_params(facts), "text": text, "active": active}


def weight_bytes(facts, quantization, tp=1):
    """Bytes of weights on each of `tp` ranks: bf16 everywhere, or FP8 linears (a byte a weight and a
    float32 scale a row) with the rest bf16."""
    p = rank_params(facts, tp)
    if quantization == "fp8":
        return p["linear"] + SCALE_BYTES * p["rows"] + 2 * p["kept"]
    return 2 * (p["linear"] + p["kept"])


def kv_bytes_per_token(facts, tp=1, kv_dtype="auto"):
    """K and V of one token on one rank: 2 x layers x K/V heads per rank x head_dim x bytes."""
    return 2 * facts.layers * kv_heads_per_rank(facts, tp) * facts.head_dim * KV_DTYPES[kv_dtype]


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
