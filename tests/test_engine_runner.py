"""The model runner is built from the engine's resolved EngineConfig: it reads its block size and limits
from it and looks up the attention backend the engine chose (a config still saying "auto" is refused:
choosing is attention_backend.choose_attention_backend's)."""
import types
from dataclasses import replace

import pytest

from byzantium import Engine, SamplingParams
from byzantium.engine.attention_backend import ModelFeatures, choose_attention_backend
from byzantium.engine.runner import ModelRunner, eager_reason
from conftest import random_prompts


def test_a_runner_from_the_engines_config_runs_as_the_engines_own(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, device="cpu", num_blocks=64, max_num_seqs=4, max_batch_tokens=32)
    config = engine.engine_config
    runner = ModelRunner(engine.model, engine.kv_cache, config)
    assert runner.ops is engine.runner.ops and runner.block_size == config.block_size
    assert runner.device == engine.kv_cache.device and runner.describe() == engine.runner.describe()
    runner.stage(config.max_num_seqs, config.max_batch_tokens, config.max_model_len, cuda_graphs=False, pin=False)
    assert runner.buffers.max_blocks == -(-config.max_model_len // config.block_size)
    prompts = random_prompts([9, 40, 3], seed=61)
    params = SamplingParams(max_tokens=5)
    expected = [o.token_ids for o in engine.generate(prompts, params)]
    engine.runner = runner  # the staged runner steps the same engine: the same tokens
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected


def test_auto_is_resolved_by_the_chooser_not_the_runner(tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, device="cpu", num_blocks=16)
    unresolved = replace(engine.engine_config, attention_backend="auto")
    with pytest.raises(ValueError, match="choose_attention_backend"):
        ModelRunner(engine.model, engine.kv_cache, unresolved)
    choice = choose_attention_backend("auto", engine.device, engine.dtype, engine.kv_cache.dtype,
                                      unresolved.cpu_kernels, ModelFeatures.of(engine.model))
    runner = ModelRunner(engine.model, engine.kv_cache, replace(unresolved, attention_backend=choice.name))
    assert choice.name == engine.attention_backend and runner.ops is engine.runner.ops


def test_why_a_cuda_runner_runs_eagerly(tiny_llama):
    _, path = tiny_llama
    config = Engine(path, device="cpu", num_blocks=16).engine_config
    triton = types.SimpleNamespace(__name__="byzantium.kernels.triton_ops")
    torch_ops = types.SimpleNamespace(__name__="byzantium.kernels.reference")
    assert eager_reason(config, triton, cuda_graphs=True) is None
    assert eager_reason(replace(config, enforce_eager=True), triton, cuda_graphs=False) == "eager (enforce_eager)"
    assert eager_reason(config, triton, cuda_graphs=False) == "eager (tensor parallelism)"
    assert "need attention_backend='triton'" in eager_reason(config, torch_ops, cuda_graphs=True)
