"""A model's architecture numbers for the planner: its config.json when the model is on this machine (a
checkpoint directory, the embedded model once converted, the Hugging Face cache; never a network call),
else a built-in table of the papers' models (the public config.json facts of each checkpoint). ModelFacts
and from_config (a config.json's numbers) are engine/memory.py's: LLMPool.plan reads checkpoints with them.

Counting parameters from these numbers (fit.params) lands within ~1 % of the published totals; what
is left out is named there (patch embeddings, projectors, biases of vision towers).
"""
import json
import os
from pathlib import Path

from ..engine.loader import HUB_ID
from ..engine.memory import ModelFacts, fp8_checkpoint, from_config


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


__all__ = ["BUILTIN", "HUB_ID", "ModelFacts", "builtin", "fp8_checkpoint", "from_config", "local_config", "model_facts"]
