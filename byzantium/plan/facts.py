"""A model's architecture numbers for the planner: its config.json when the model is on this machine (a
checkpoint directory, the embedded model once converted, the Hugging Face cache; never a network call),
else a built-in table of the papers' models (the public config.json facts of each checkpoint).

Counting parameters from these numbers (count.py) lands within ~1 % of the published totals; what
is left out is named there (patch embeddings, projectors, biases of vision towers).
"""
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # as engine/loader.py's (kept here: no engine import)


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs of a model. Sizes are of the text tower (the engine skips vision towers)."""
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


def _facts(name, **numbers):
    return ModelFacts(name=name, **numbers)


# The papers' models (byzantium/experiments/configs/*.toml at paper scale), from each checkpoint's
# public config.json (text_config for the multimodal ones). The vision numbers only count parameters.
BUILTIN = {f.name.lower(): f for f in (
    _facts("meta-llama/Llama-3.3-70B-Instruct", hidden=8192, layers=80, heads=64, kv_heads=8, head_dim=128,
           vocab=128256, intermediate=28672, context=131072),
    _facts("meta-llama/Meta-Llama-3-8B-Instruct", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
           vocab=128256, intermediate=14336, context=8192),
    # Every layer MoE (interleave_moe_layer_step 1): 16 routed experts of 8192 and a shared one, top-1;
    # three layers in four attend in chunks of 8192 tokens (attention_chunk_size), counted in full here.
    _facts("meta-llama/Llama-4-Scout-17B-16E-Instruct", hidden=5120, layers=48, heads=40, kv_heads=8, head_dim=128,
           vocab=202048, intermediate=16384, experts=16, experts_per_token=1, expert_intermediate=8192,
           moe_layers=48, shared_intermediate=8192, window_layers=36, context=10485760,
           vision=(1408, 34, 5632, 2)),
    _facts("mistralai/Mistral-Small-3.1-24B-Instruct-2503", hidden=5120, layers=40, heads=32, kv_heads=8,
           head_dim=128, vocab=131072, intermediate=32768, context=131072, vision=(1024, 24, 4096, 3)),
    _facts("Qwen/Qwen2.5-32B-Instruct", hidden=5120, layers=64, heads=40, kv_heads=8, head_dim=128, vocab=152064,
           intermediate=27648, qkv_bias=True, context=32768),
    _facts("Qwen/Qwen2.5-1.5B-Instruct", hidden=1536, layers=28, heads=12, kv_heads=2, head_dim=128, vocab=151936,
           intermediate=8960, tied=True, qkv_bias=True, context=32768),
    _facts("Qwen/Qwen3-30B-A3B", hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, vocab=151936,
           intermediate=6144, experts=128, experts_per_token=8, expert_intermediate=768, moe_layers=48,
           qk_norm=True, context=40960),
    _facts("Qwen/Qwen3-4B", hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936,
           intermediate=9728, tied=True, qk_norm=True, context=40960),
    # Five layers in six attend within a sliding window of 1024 tokens, counted in full here.
    _facts("google/gemma-3-12b-it", hidden=3840, layers=48, heads=16, kv_heads=8, head_dim=256, vocab=262208,
           intermediate=15360, tied=True, qk_norm=True, norms_per_layer=4, window_layers=40, context=131072,
           vision=(1152, 27, 4304, 2)),
    # The embedded model (its config.json is read instead once it has been converted).
    _facts("smollm2-135m", hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, vocab=49152,
           intermediate=1536, tied=True, context=8192),
)}


def builtin(name):
    """The table's facts for a hub id or its last part (`Llama-3.3-70B-Instruct`), any case; None."""
    key = str(name).lower()
    if key in BUILTIN:
        return BUILTIN[key]
    matches = [f for k, f in BUILTIN.items() if k.split("/")[-1] == key]
    return matches[0] if len(matches) == 1 else None


def local_config(name):
    """(config.json's path, where) when the model is on this machine, looked up without any network
    call and without converting anything; None otherwise."""
    text = os.fspath(name)
    path = Path(text).expanduser()
    if path.is_dir():
        return (path / "config.json", "its config.json") if (path / "config.json").is_file() else None
    if text.lower() == "smollm2-135m":  # the embedded model: its conversion's config.json, once converted
        try:
            from ..engine.loader import embedded_gguf, gguf_cache_dir
            config = gguf_cache_dir(embedded_gguf(text.lower())) / "config.json"
        except Exception:  # the package is not installed: the table below
            return None
        return (config, "the embedded model's config.json") if config.is_file() else None
    if HUB_ID.match(text):
        try:
            from huggingface_hub import try_to_load_from_cache
            found = try_to_load_from_cache(text, "config.json")
        except Exception:
            return None
        if isinstance(found, str):
            return Path(found), "config.json in the Hugging Face cache"
    return None


def model_facts(name):
    """A model's facts: its config.json when it is here, else the built-in table; a ValueError naming
    the model and how to give its facts otherwise."""
    found = local_config(name)
    if found is not None:
        path, where = found
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"model {name!r}: cannot read {path}: {error}") from None
        return from_config(str(name), config, f"{where} ({path})")
    facts = builtin(name)
    if facts is not None:
        return facts
    if Path(os.fspath(name)).expanduser().exists():
        raise ValueError(f"model {name!r}: no config.json there; the planner reads a checkpoint directory "
                         "(config.json, as on the Hugging Face hub)")
    known = ", ".join(f.name for f in BUILTIN.values())
    raise ValueError(f"unknown model {name!r}: not on this machine (no checkpoint directory, not in the Hugging "
                     f"Face cache) and not in the planner's table ({known}). Give its facts as a local checkpoint "
                     f"directory with its config.json (the weights are not needed), e.g. "
                     f"`huggingface-cli download {name} config.json --local-dir DIR` and `byzantium plan DIR`")


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
