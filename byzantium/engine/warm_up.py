"""The engine's warm-up before it plans its memory: the largest steps it will form, run on a small pool, so
planning (planning.py) gets the activations they allocate as numbers."""
import torch

from .memory import DEFAULT_MEMORY_FRACTION, WarmUpPeaks
from .planning import block_bytes, enough_blocks, graph_pool_bytes, memory_held, plan_num_blocks, warm_up_blocks
from .sampling import SamplingParams


def planned_num_blocks(engine, fraction=None):
    """Warm the engine up on a small pool to measure its activations, let the pool go, and plan the KV
    blocks of `fraction` of the device (default memory.DEFAULT_MEMORY_FRACTION) from the numbers."""
    engine.build_cache(warm_up_blocks(engine.engine_config))
    peaks = warm_up(engine)
    engine.activations_bytes = peaks.activations if peaks is not None else None
    weights = memory_held(engine)["weights_bytes"]
    engine.kv_cache = engine.runner = engine.block_manager = engine.scheduler = None  # and all holding it (graphs)
    return plan_num_blocks(engine.device, fraction or DEFAULT_MEMORY_FRACTION, weights, peaks, block_bytes(engine),
                           enough_blocks(engine), str(engine.model_dir))


def warm_up(engine):
    """Run the largest prefill step (dummy tokens, logits only) and, on CUDA, a sampled step of
    max_num_seqs single-token rows (the most logits rows, top-k/top-p sorts, the largest decode CUDA
    graph); WarmUpPeaks: the most each kind of step allocated beyond what it started with, and the
    captured graphs' pool (CUDA; None elsewhere). Leaves no trace in the stats."""
    config = engine.engine_config
    per = max(1, min(config.max_model_len - 1, config.max_batch_tokens))
    prompts, left = [], config.max_batch_tokens
    while left > 0 and len(prompts) < config.max_num_seqs:
        prompts.append([0] * min(per, left))
        left -= len(prompts[-1])
    cuda = engine.device.type == "cuda"
    engine.step_peak.reset()
    engine.logits(prompts, tag="warm-up")
    prefill = engine.step_peak.bytes
    if cuda:
        engine.step_peak.reset()
        rows = SamplingParams(max_tokens=2, temperature=1.0, top_k=50, top_p=0.9, seed=0)
        engine.generate([[0]] * config.max_num_seqs, rows, tag="warm-up")
    engine.reset_stats()
    if not cuda:
        return None
    torch.cuda.synchronize(engine.device)
    return WarmUpPeaks(prefill, engine.step_peak.bytes, graph_pool_bytes(engine))
