"""How many KV blocks an engine gets, and what it holds in memory (memory.py has the arithmetic).

Planning takes numbers and returns numbers: the warm-up that measures an engine's activations is the
engine's own (warm_up.py), run before it plans."""
import torch

from .memory import DEFAULT_CPU_KV_GIB, kv_blocks, physical_memory


def block_bytes(engine):
    return (2 * engine.config.num_hidden_layers * engine.block_size * engine.model.num_kv_heads
            * engine.model.head_dim * engine.kv_cache_dtype.itemsize)


def enough_blocks(engine):
    """Blocks for every sequence at full length: more are never used."""
    return engine.max_num_seqs * -(-engine.max_model_len // engine.block_size)


def default_num_blocks(engine, kv_cache_gib):
    """Blocks of a KV budget of kv_cache_gib (default DEFAULT_CPU_KV_GIB), no more than the run can use."""
    budget = (DEFAULT_CPU_KV_GIB if kv_cache_gib is None else kv_cache_gib) * 2**30
    return max(1, min(int(budget // block_bytes(engine)), enough_blocks(engine)))


def plan_num_blocks(device, fraction, weights, peaks, block_bytes, enough, what):
    """KV blocks from what is left of an engine's share of the device (`fraction` of its memory: weights,
    activations and KV together) given its weights' bytes and the peaks its warm-up measured (warm_up.py:
    on CUDA the prefill peak plus the decode graphs' pool, WarmUpPeaks; None on the CPU, where the share is
    of RAM and activations are not measured), at most `enough`. `what` names the model in the error. Call
    it with nothing of the engine's allocated beyond its weights: on CUDA the free memory is read here."""
    activations = peaks.activations if peaks is not None else 0
    if device.type == "cuda":
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
    else:
        total = free = physical_memory()
    blocks = kv_blocks(total, fraction, weights, activations, free, block_bytes)
    if blocks < 1:
        raise ValueError(f"{what} does not fit in memory_fraction={fraction} of the {device} "
                         f"({total / 2**30:.1f} GiB): weights {weights / 2**30:.2f} GiB, activations "
                         f"{activations / 2**30:.2f} GiB{graph_pool_note(peaks)} leave nothing for "
                         f"the KV cache; raise memory_fraction or lower max_batch_tokens")
    return min(blocks, enough)


def warm_up_blocks(config):
    """The pool a warm-up needs: the largest prefill step and a row for each sequence."""
    return -(-config.max_batch_tokens // config.block_size) + config.max_num_seqs


def graph_pool_bytes(engine):
    """Bytes of the segments the allocator keeps for this engine's decode CUDA graphs (0 before any
    capture, or without graphs). Read from the allocator's segments, not from what is allocated: the
    blocks a capture freed stay in the pool, free to its replays only."""
    graphs = getattr(engine.runner, "graphs", None)
    pool = getattr(graphs, "pool", None)
    if pool is None or engine.device.type != "cuda":
        return 0
    index = engine.device.index if engine.device.index is not None else torch.cuda.current_device()
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if s["device"] == index and tuple(s.get("segment_pool_id", ())) == tuple(pool))


def graph_pool_note(peaks):
    return f" (graph pool {peaks.graph_pool / 2**30:.2f} GiB of them)" if peaks and peaks.graph_pool else ""


def memory_held(engine):
    """Bytes held: the weights, the KV pool (and how much of it is in use now), and on CUDA the peak
    of everything else (activations, workspaces) one of this engine's steps allocated and the segments
    its decode graphs hold."""
    seen, weights = set(), 0
    packed = [m.packed for m in engine.model.modules() if isinstance(getattr(m, "packed", None), torch.Tensor)]
    for t in [*engine.model.parameters(), *engine.model.buffers(), *packed]:
        key = id(t) if t.is_mkldnn else t.data_ptr()  # oneDNN's packed weights have no storage pointer
        if t.device.type != "meta" and key not in seen:
            seen.add(key)
            weights += t.numel() * t.element_size()
    kv = engine.kv_cache.numel() * engine.kv_cache.element_size()
    cuda = engine.device.type == "cuda"
    peak = engine.step_peak.bytes if cuda else None
    return {"weights_bytes": weights, "kv_cache_bytes": kv, "kv_blocks": engine.num_blocks,
            "kv_blocks_used": engine.block_manager.num_used, "activations_peak_bytes": peak,
            "graph_pool_bytes": graph_pool_bytes(engine) if cuda else None}


class StepPeak:
    """CUDA: the most one step (forward pass and sampling) allocated beyond what it started with: this
    engine's own, whatever other engines on the device hold (an LLMPool). Elsewhere it stays 0."""

    def __init__(self, device):
        self.device, self.bytes, self.held = device, 0, None

    def reset(self):
        self.bytes = 0

    def start(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.held = torch.cuda.memory_allocated(self.device)

    def end(self):
        if self.held is not None:
            self.bytes = max(self.bytes, torch.cuda.max_memory_allocated(self.device) - self.held)
            self.held = None
