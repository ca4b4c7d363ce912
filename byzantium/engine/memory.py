"""Memory planning: how many KV blocks an engine gets, and how models that share a device split it.

An engine owns a share of its device (`memory_fraction`): its weights, the activations of its largest
step (measured by a warm-up forward) and its KV cache together. Engines that share a device (LLMPool)
split the pool's fraction: each model's weights first, then the rest in proportion to each model's KV
bytes per token, so that every model can hold the same number of tokens.
"""
import json
import os
import struct
from pathlib import Path

DEFAULT_MEMORY_FRACTION = 0.9  # an engine alone on a GPU plans weights + activations + KV in 90 % of it
CPU_KV_RAM_SHARE = 0.25  # the most of the machine's RAM one engine's KV pool may grow into on CPU
PLANNING_MARGIN = 256 * 2**20  # left free on the device beyond the plan (allocator slack, other libraries)


def physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume 16 GiB
        return 16 * 2**30


def kv_blocks(total, fraction, weights, activations, free, block_bytes):
    """KV blocks that fit both this engine's share (fraction * total, less its weights and activations)
    and what is free on the device now (less the activations still to come and a margin)."""
    share = fraction * total - weights - activations
    available = free - activations - PLANNING_MARGIN
    return int(min(share, available) // block_bytes)


def checkpoint_params(model_dir):
    """Number of parameters in a directory's *.safetensors files, read from their headers only."""
    count = 0
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                n = 1
                for d in entry["shape"]:
                    n *= d
                count += n
    return count


def kv_bytes_per_token(config, itemsize):
    config = getattr(config, "text_config", None) or config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * itemsize


def split_memory(models, fraction, total):
    """{name: memory_fraction} for models sharing a device of `total` bytes within `fraction` of it.
    models: {name: (weights_bytes, kv_bytes_per_token)}. Raises when the weights alone do not fit."""
    weights = sum(w for w, _ in models.values())
    left = fraction * total - weights
    if left <= 0:
        raise ValueError(f"the weights of {', '.join(models)} ({weights / 2**30:.1f} GiB) do not fit in "
                         f"{fraction} of the device ({total / 2**30:.1f} GiB)")
    per_token = sum(kv for _, kv in models.values())
    return {name: (w + left * kv / per_token) / total for name, (w, kv) in models.items()}
