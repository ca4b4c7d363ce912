"""Memory planning: how many KV blocks an engine gets, and how models that share a device split it.

An engine owns a share of its device (`memory_fraction`): its weights, the activations of its largest
step (measured by a warm-up forward) and its KV cache together; on CUDA the activations are the largest
prefill step's plus the decode graphs' memory pool, which stays reserved under it (WarmUpPeaks).
Engines that share a device (LLMPool) split the pool's fraction: each model's weights first, then the
rest in proportion to each model's KV bytes per token, so that every model can hold the same number of
tokens.

What one rank of a model holds, from its config.json's numbers (ModelFacts) before anything loads: the
weights at a tensor-parallel size and weight dtype (rank_weight_bytes), and the K/V bytes of a token
(kv_bytes_per_token). LLMPool.plan sizes its engines with them, and `byzantium plan` (byzantium/plan/)
plans GPUs with the same arithmetic.
"""
import json
import os
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path

DEFAULT_MEMORY_FRACTION = 0.9  # an engine alone on a GPU plans weights + activations + KV in 90 % of it
DEFAULT_CPU_KV_GIB = 2.0  # one engine's KV pool on CPU when no budget is given: a fixed size a user can predict
PLANNING_MARGIN = 256 * 2**20  # left free on the device beyond the plan (allocator slack, other libraries)


def physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume 16 GiB
        return 16 * 2**30


@dataclass(frozen=True)
class WarmUpPeaks:
    """What a CUDA engine's warm-up measured beyond its weights and KV pool, in bytes: the most its largest
    prefill step allocated, the most its largest decode step allocated (the step that captures the decode
    CUDA graph, so the graph pool is inside it), and the graph pool's segments once captured."""
    prefill: int
    decode: int
    graph_pool: int = 0

    @property
    def activations(self):
        """Room to plan beside weights and KV. A captured graph's pool stays reserved for its replays, so
        every prefill step after the first decode runs on top of it: the two add, and the larger of the
        prefill peak and the decode peak would leave the pool out of the budget."""
        return max(self.prefill + self.graph_pool, self.decode)


def kv_blocks(total, fraction, weights, activations, free, block_bytes):
    """KV blocks that fit both this engine's share (fraction * total, less its weights and activations)
    and what is free on the device now (less the activations still to come and a margin)."""
    share = fraction * total - weights - activations
    available = free - activations - PLANNING_MARGIN
    return int(min(share, available) // block_bytes)


FP8_SCALE_BYTES = 4  # an FP8 linear's scale per output row (float32)
# quantization="fp8" (and an FP8 checkpoint whose expert linears are FP8) makes the stacked MoE experts FP8
# too, e4m3 with an fp32 scale per (expert, output row) (engine/quantization.py swap_fp8_experts, models/moe.py).
FP8_EXPERTS = True
FP8_DTYPES = ("F8_E4M3", "F8_E5M2")  # safetensors' names of 8-bit float tensors
_TEXT_LAYER = re.compile(r"(?:^|\.)layers\.\d+\.")  # a decoder layer's tensor
_NOT_TEXT = ("vision", "visual", "multi_modal", "audio")  # towers the engine does not load


def checkpoint_header(model_dir):
    """(name, dtype, shape) of every tensor in a directory's *.safetensors files, read from their headers."""
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                yield name, entry["dtype"], entry["shape"]


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def checkpoint_params(model_dir):
    """Number of parameters in a directory's *.safetensors files, read from their headers only."""
    return sum(_count(shape) for _, _, shape in checkpoint_header(model_dir))


def fp8_shares(model_dir):
    """(linears, experts): the shares of a checkpoint's decoder-layer linear weights (attention, dense
    MLPs, shared experts) and of its routed experts' weights, in elements, stored as 8-bit floats, read from
    its safetensors headers (routers, norms, the embedding, the LM head and vision towers left out); None
    for a part it has none of (or without safetensors files)."""
    counts = {"linear": [0, 0], "experts": [0, 0]}  # [fp8 elements, all elements]
    for name, dtype, shape in checkpoint_header(model_dir):
        parts = name.split(".")
        if not _TEXT_LAYER.search(name) or any(word in name for word in _NOT_TEXT) or parts[-2] in ("gate", "router"):
            continue
        if "experts" in parts:  # experts.{e}.gate_proj.weight, or stacked experts.gate_up_proj / down_proj
            if not (parts[-1] == "weight" or parts[-1] in ("gate_up_proj", "down_proj")) or len(shape) < 2:
                continue
            kind = "experts"
        elif parts[-1] == "weight" and len(shape) == 2:
            kind = "linear"
        else:
            continue
        counts[kind][1] += _count(shape)
        counts[kind][0] += _count(shape) if dtype in FP8_DTYPES else 0
    return tuple(fp8 / total if total else None for fp8, total in counts.values())


# ---------------------------------------------------------------------- a model's numbers (config.json)

@dataclass(frozen=True)
class ModelFacts:
    """What memory planning needs of a model. Sizes are of the text tower (the engine skips vision towers)."""
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int  # the dense MLP's width (layers without experts)
    tied: bool = False  # the LM head is the embedding
    experts: int = 0  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0
    expert_intermediate: int = 0
    moe_layers: int = 0  # layers whose MLP is the experts (the others dense)
    shared_intermediate: int = 0  # a shared expert beside the routed ones in each MoE layer (Llama 4)
    qkv_bias: bool = False  # Qwen2.5
    qk_norm: bool = False  # a norm of head_dim on queries and keys (Qwen3, Gemma 3)
    norms_per_layer: int = 2  # Gemma 3 has four
    window_layers: int = 0  # layers with a sliding window or chunked attention (their KV counted in full)
    context: int | None = None  # max_position_embeddings
    vision: tuple = ()  # (hidden, layers, intermediate, MLP matrices) of a vision encoder the engine skips
    fp8_checkpoint: bool = False  # the checkpoint's weights already are FP8 (compressed-tensors / fp8)
    source: str = "built-in table"


def from_config(name, config, source="config.json"):
    """ModelFacts from a config.json's dict (a multimodal one's text_config); a ValueError naming what
    is missing or not planned."""
    text = config.get("text_config") or config
    get = lambda key, default=None: text.get(key, config.get(key, default))  # noqa: E731
    try:
        hidden, layers, heads = int(get("hidden_size")), int(get("num_hidden_layers")), int(get("num_attention_heads"))
        vocab = int(get("vocab_size"))
    except (TypeError, ValueError):
        raise ValueError(f"model {name!r}: its config.json lacks hidden_size, num_hidden_layers, "
                         "num_attention_heads or vocab_size (not a decoder the planner knows)") from None
    kv_heads = int(get("num_key_value_heads") or heads)
    head_dim = int(get("head_dim") or hidden // heads)
    experts = int(get("num_experts") or get("num_local_experts") or 0)
    gemma = str(get("model_type", "")).startswith("gemma")  # Gemma ties its LM head unless told otherwise
    numbers = dict(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab,
                   intermediate=int(get("intermediate_size") or 0), tied=bool(get("tie_word_embeddings", gemma)),
                   qkv_bias=bool(get("attention_bias", False)) or get("model_type") in ("qwen2", "qwen2_moe"),
                   qk_norm=get("model_type") in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"),
                   norms_per_layer=4 if gemma else 2,
                   context=get("max_position_embeddings"))
    if experts:
        numbers.update(experts=experts, experts_per_token=int(get("num_experts_per_tok") or 1))
        if get("moe_intermediate_size"):  # Qwen-MoE: every layer but mlp_only_layers, one in decoder_sparse_step
            step = int(get("decoder_sparse_step") or 1)
            only = set(get("mlp_only_layers") or [])
            moe = [i for i in range(layers) if i not in only and (i + 1) % step == 0]
            numbers.update(expert_intermediate=int(get("moe_intermediate_size")), moe_layers=len(moe),
                           shared_intermediate=int(get("shared_expert_intermediate_size") or 0))
        elif get("intermediate_size_mlp"):  # Llama 4: experts (and a shared one) of intermediate_size
            moe = get("moe_layers")
            step = int(get("interleave_moe_layer_step") or 1)
            count = len(moe) if isinstance(moe, list) else len(range(step - 1, layers, step))
            numbers.update(expert_intermediate=numbers["intermediate"], moe_layers=count,
                           shared_intermediate=numbers["intermediate"],
                           intermediate=int(get("intermediate_size_mlp")))
        else:  # Mixtral: every layer's MLP is the experts, each of intermediate_size
            numbers.update(expert_intermediate=numbers["intermediate"], moe_layers=layers)
    windows = get("layer_types")
    if isinstance(windows, list):
        numbers["window_layers"] = sum(t != "full_attention" for t in windows)
    elif get("attention_chunk_size") and isinstance(get("no_rope_layers"), list):
        numbers["window_layers"] = sum(1 for r in get("no_rope_layers") if r)
    vision = config.get("vision_config")
    if isinstance(vision, dict) and vision.get("hidden_size") and vision.get("num_hidden_layers"):
        gated = vision.get("model_type") == "pixtral" or vision.get("hidden_act") == "silu"
        numbers["vision"] = (int(vision["hidden_size"]), int(vision["num_hidden_layers"]),
                             int(vision.get("intermediate_size") or 4 * vision["hidden_size"]), 3 if gated else 2)
    return replace(ModelFacts(name=name, **numbers), fp8_checkpoint=fp8_checkpoint(name, config), source=source)


def fp8_checkpoint(name, config):
    """Whether the checkpoint's weights are stored as FP8: a quantization_config of quant_method "fp8", or
    compressed-tensors with 8-bit float weights. Another quantization is refused (a ValueError)."""
    quant = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    if not quant:
        return False
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return True
    if method == "compressed-tensors":
        groups = quant.get("config_groups") or {}
        weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)]
        if weights and all(w.get("num_bits") == 8 and w.get("type") == "float" for w in weights):
            return True
    raise ValueError(f"model {name!r}: its quantization_config ({method or 'unknown'}) is not FP8; the planner "
                     "knows bf16 and fp8 weights")


# ---------------------------------------------------------------------- what one rank holds

def kv_heads_per_rank(kv_heads, tp):
    """K/V heads each of `tp` ranks holds: its share, or one replicated head when ranks outnumber them."""
    return max(1, kv_heads // tp)


def rank_params(facts, tp=1):
    """Parameters one rank of `tp` holds: {"linear": in the decoder linears FP8 quantizes (attention
    projections, dense MLPs, shared experts), "rows": those linears' output rows (one FP8 scale each),
    "experts": in the routed experts (dealt out whole), "expert_rows": theirs, "kept": in what stays in
    the compute dtype (embedding and LM head, split over the vocabulary, the last slice padded; norms,
    routers and biases, replicated)}."""
    f, h, d = facts, facts.hidden, facts.head_dim
    q, kv = f.heads // tp, kv_heads_per_rank(f.kv_heads, tp)
    linear = f.layers * (h * d * (q + 2 * kv) + q * d * h)
    rows = f.layers * (d * (q + 2 * kv) + h)
    kept = f.layers * (f.norms_per_layer * h + (2 * d if f.qk_norm else 0) + (d * (q + 2 * kv) if f.qkv_bias else 0))
    experts = expert_rows = 0
    dense = f.layers - f.moe_layers
    if dense and f.intermediate:
        linear += dense * 3 * h * (f.intermediate // tp)
        rows += dense * (2 * (f.intermediate // tp) + h)
    if f.moe_layers:
        local = f.experts // tp
        experts = f.moe_layers * local * 3 * h * f.expert_intermediate
        expert_rows = f.moe_layers * local * (2 * f.expert_intermediate + h)
        kept += f.moe_layers * h * f.experts  # the router, replicated
        if f.shared_intermediate:
            linear += f.moe_layers * 3 * h * (f.shared_intermediate // tp)
            rows += f.moe_layers * (2 * (f.shared_intermediate // tp) + h)
    vocab = -(-f.vocab // tp)
    kept += vocab * h * (1 if f.tied else 2) + h  # embedding, LM head, the final norm
    return {"linear": linear, "rows": rows, "experts": experts, "expert_rows": expert_rows, "kept": kept}


def rank_weight_bytes(facts, tp=1, fp8=0.0, itemsize=2, fp8_experts=None):
    """Bytes of weights on each of `tp` ranks. fp8: the share of the decoder linears held in FP8 (0: none,
    1: all, as quantization="fp8" makes them; an FP8 checkpoint's share as stored, fp8_shares), a byte a
    weight plus a float32 scale a row; fp8_experts: the routed experts' share likewise (default: fp8's;
    while FP8_EXPERTS is False the experts stay in the compute dtype); the rest at `itemsize` bytes."""
    p = rank_params(facts, tp)

    def part(params, rows, share):
        return params * (share + (1 - share) * itemsize) + FP8_SCALE_BYTES * rows * share

    experts = (fp8 if fp8_experts is None else fp8_experts) if FP8_EXPERTS else 0.0
    return round(part(p["linear"], p["rows"], fp8) + part(p["experts"], p["expert_rows"], experts)
                 + itemsize * p["kept"])


def kv_bytes_per_token(facts, tp=1, itemsize=2):
    """K and V of one token on one rank: 2 x layers x K/V heads per rank x head_dim x bytes. Layers with a
    sliding window or chunked attention are counted in full (the engine's KV pool gives every layer a row
    for every token it holds)."""
    return 2 * facts.layers * kv_heads_per_rank(facts.kv_heads, tp) * facts.head_dim * itemsize


def model_memory(model_dir, itemsize, tensor_parallel_size=1, quantization=None, kv_cache_dtype="auto"):
    """(weight bytes, KV bytes per token) of one rank of a local checkpoint directory, from its config.json
    and safetensors headers (nothing loaded): the weights at `itemsize` (the compute dtype), the decoder
    linears in FP8 with quantization="fp8" or as an FP8 checkpoint stores them; K/V at one byte with
    kv_cache_dtype="fp8"."""
    path = Path(model_dir)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"model {str(model_dir)!r}: cannot read its config.json ({error})") from None
    facts = from_config(str(model_dir), config)
    if facts.fp8_checkpoint:
        linears, experts = fp8_shares(path)
        fp8 = 1.0 if linears is None else linears
        fp8_experts = fp8 if experts is None else experts
    else:
        fp8 = fp8_experts = 1.0 if quantization == "fp8" else 0.0
    weights = rank_weight_bytes(facts, tensor_parallel_size, fp8, itemsize, fp8_experts)
    kv = kv_bytes_per_token(facts, tensor_parallel_size, 1 if kv_cache_dtype == "fp8" else itemsize)
    return weights, kv


def split_memory(models, fraction, total):
    """{name: memory_fraction} for models sharing a device of `total` bytes within `fraction` of it.
    models: {name: (weights_bytes, kv_bytes_per_token)}. Raises when the weights alone do not fit."""
    weights = sum(w for w, _ in models.values())
    left = fraction * total - weights
    if left <= 0:
        raise ValueError(f"the weights of {', '.join(map(str, models))} ({weights / 2**30:.1f} GiB on this device) "
                         f"do not fit in {fraction} of it ({total / 2**30:.1f} GiB)")
    per_token = sum(kv for _, kv in models.values())
    return {name: (w + left * kv / per_token) / total for name, (w, kv) in models.items()}
