"""choose_attention_backend: the one place that decides which attention backend runs a model, and why.

Checked against the real backends: the capability table's CPU head sizes are those the compiled kernels
take, a model's features are read off the real model code, and every refusal names what is missing."""
import pytest
import torch
import transformers

from byzantium.engine.attention_backend import (BACKENDS, CAPABILITIES, Choice, ModelFeatures,
                                                choose_attention_backend)
from byzantium.engine.models.gemma3 import Gemma3ForCausalLM
from byzantium.engine.models.llama import LlamaForCausalLM
from byzantium.kernels import ATTENTION_BACKENDS, attention_ops, backend_name, cpu_ext

FP8 = torch.float8_e4m3fn
HAS_KERNELS = cpu_ext.load() is not None
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=64, max_position_embeddings=128)


def test_the_table_names_the_backends_the_kernels_have():
    assert set(BACKENDS) == set(ATTENTION_BACKENDS) - {"auto"}
    assert [backend_name(attention_ops(name)) for name in ("torch", "cpu")] == ["torch", "cpu"]


@pytest.mark.skipif(not HAS_KERNELS, reason="the compiled CPU kernels are not available here")
def test_the_cpu_head_sizes_are_those_the_kernels_take():
    ext = cpu_ext.load()
    assert [d for d in range(1, 513) if ext.decode_supported(d)] == list(CAPABILITIES["cpu"].head_dims)


def test_features_are_read_off_the_model_code():
    with torch.device("meta"):
        llama = LlamaForCausalLM(transformers.LlamaConfig(**SMALL))
        gemma = Gemma3ForCausalLM(transformers.Gemma3TextConfig(**SMALL, head_dim=16, sliding_window=8,
                                                                layer_types=["sliding_attention", "full_attention"]))
    assert ModelFeatures.of(llama) == ModelFeatures(head_dim=16)
    assert ModelFeatures.of(gemma) == ModelFeatures(head_dim=16, window=True)


@pytest.mark.skipif(not HAS_KERNELS, reason="the compiled CPU kernels are not available here")
def test_auto_on_the_cpu_takes_the_kernels_where_they_can_run_the_model():
    plain = ModelFeatures(head_dim=64)
    assert choose_attention_backend("auto", "cpu", torch.float32, features=plain) == Choice(
        "cpu", "auto: the compiled CPU kernels")
    assert choose_attention_backend("auto", "cpu", torch.bfloat16, features=plain).name == "cpu"
    for masked in (ModelFeatures(head_dim=64, window=True), ModelFeatures(head_dim=64, chunk=True)):
        assert choose_attention_backend("auto", "cpu", torch.float32, features=masked).name == "cpu"
    for kv, features, why in [(None, ModelFeatures(head_dim=48, window=True), "not 48"),
                              (FP8, ModelFeatures(head_dim=64, chunk=True), "float8_e4m3fn KV cache")]:
        choice = choose_attention_backend("auto", "cpu", torch.float32, kv, features=features)
        assert choice.name == "torch" and why in choice.reason
    off = choose_attention_backend("auto", "cpu", torch.float32, cpu_kernels=False, features=plain)
    assert off == Choice("torch", "auto: cpu_kernels=False")


def test_auto_without_the_kernels_says_why(monkeypatch):
    monkeypatch.setattr(cpu_ext, "load", lambda: None)
    choice = choose_attention_backend("auto", "cpu", torch.float32, features=ModelFeatures(head_dim=64))
    assert choice.name == "torch" and "compiled CPU kernels are not available" in choice.reason
    with pytest.raises(ValueError, match="'cpu' cannot run this model: the compiled CPU kernels are not available"):
        choose_attention_backend("cpu", "cpu", torch.float32, features=ModelFeatures(head_dim=64))


def test_requests_that_cannot_run_the_model_are_refused_naming_what_is_missing():
    with pytest.raises(ValueError, match="unknown attention_backend 'xformers'"):
        choose_attention_backend("xformers")
    with pytest.raises(ValueError, match="'cpu' cannot run this model: cpu does not read a float8_e4m3fn KV cache; "
                                         "use 'torch'"):
        choose_attention_backend("cpu", "cpu", torch.float32, FP8)
    with pytest.raises(ValueError, match="'triton' cannot run this model: triton runs on cuda, not cpu"):
        choose_attention_backend("triton", "cpu")
    with pytest.raises(ValueError, match="flash_attn does not read a float32 KV cache"):
        choose_attention_backend("flash_attn", "cuda", torch.float32)
    with pytest.raises(ValueError, match="flash_attn has no chunked attention"):
        choose_attention_backend("flash_attn", "cuda", torch.bfloat16, features=ModelFeatures(chunk=True))
    assert choose_attention_backend("torch", "cpu", torch.float32, FP8, features=ModelFeatures(48, True, True)) == \
        Choice("torch", "requested")
