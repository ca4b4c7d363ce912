"""A rank's KV pool and the runner that reads it, built from the engine's config the same way on rank 0 and
on every other tensor-parallel rank (each holds its slice of the heads)."""
from .kv_cache import allocate_kv_cache, kv_cache_dtype
from .runner import ModelRunner


def build_pool_and_runner(model, config, num_blocks, device, cuda_graphs=False):
    """(pool, runner) for `num_blocks` blocks on `device`, this rank's (config.device is rank 0's). A KV budget
    the user set (kv_cache_gib) is reserved now, on every rank: resident memory does not then climb as blocks
    are first used. cuda_graphs: rank 0 of a single-rank engine that does not enforce eager."""
    kv_cache = allocate_kv_cache(model.config.num_hidden_layers, num_blocks, config.block_size, model.num_kv_heads,
                                 model.head_dim, kv_cache_dtype(config.kv_cache_dtype, config.dtype), device,
                                 reserve=config.kv_cache_gib is not None)
    runner = ModelRunner(model, kv_cache, config, cuda_graphs)
    return kv_cache, runner
