"""Mistral 3 checkpoints (Mistral3ForConditionalGeneration, e.g. Mistral-Small-3.1-24B): the engine serves
their text tower. A tiny random model built from Mistral3Config (tiny Mistral text tower, tiny Pixtral
vision tower), saved by transformers, loaded by our engine (vision tensors skipped), against
transformers' Mistral3ForConditionalGeneration run on text: the same greedy tokens over a batch of
ragged prompts, logits within 1e-4."""
import shutil

import pytest
import torch

from byzantium import Engine, SamplingParams
from conftest import TINY, random_prompts

LENGTHS = [3, 9, 16, 17, 31, 40, 52]
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, head_dim=16,
              image_size=32, patch_size=8)


def build_tiny_mistral3(**overrides):
    import transformers
    text = transformers.MistralConfig(**dict(TINY, head_dim=16))
    vision = transformers.PixtralVisionConfig(**VISION)
    torch.manual_seed(1234)
    config = transformers.Mistral3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                         image_token_index=TINY["vocab_size"] - 1, **overrides)
    return transformers.Mistral3ForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def tiny_mistral3(tmp_path_factory):
    """name -> (transformers model, saved directory): the outer config's default (tied embeddings, as
    transformers 5 reads it) and one with its own lm_head."""
    models = {}
    for name, overrides in {"tied": {}, "own-head": dict(tie_word_embeddings=False)}.items():
        model = build_tiny_mistral3(**overrides)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        models[name] = (model, path)
    return models


def hf_greedy(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def test_checkpoint_has_a_vision_tower(tiny_mistral3):
    from safetensors import safe_open
    _, path = tiny_mistral3["own-head"]
    with safe_open(next(path.glob("*.safetensors")), "pt") as f:
        names = list(f.keys())
    assert any(n.startswith("vision_tower.") for n in names) and any("multi_modal_projector" in n for n in names)
    assert "language_model.lm_head.weight" in names


@pytest.mark.parametrize("variant", ["tied", "own-head"])
def test_greedy_and_logits_match_transformers(tiny_mistral3, variant):
    hf, path = tiny_mistral3[variant]
    engine = Engine(path, num_blocks=128)
    assert engine.describe()["architecture"] == "Mistral3ForConditionalGeneration"
    assert engine.model.tie_word_embeddings == (variant == "tied")
    assert engine.config.model_type == "mistral"  # the engine sizes itself by the text tower
    prompts = random_prompts(LENGTHS, seed=7)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True))
    assert engine.stats["max_batch_seqs"] == len(prompts)
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == hf_greedy(hf, prompt, 20)
    ours = engine.logits(prompts)
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            torch.testing.assert_close(ours[i], hf(torch.tensor([prompt])).logits[0, -1], atol=1e-4, rtol=1e-4)


def test_transformers_5_names(tiny_mistral3, tmp_path):
    """The layout transformers 5 keeps in memory (model.language_model.*, model.vision_tower.*, lm_head.*)
    loads the same."""
    from safetensors.torch import load_file, save_file
    _, path = tiny_mistral3["own-head"]
    renames = (("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
               ("vision_tower.", "model.vision_tower."), ("multi_modal_projector.", "model.multi_modal_projector."))
    tensors = {}
    for name, tensor in load_file(next(path.glob("*.safetensors"))).items():
        for old, new in renames:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        tensors[name] = tensor
    (tmp_path / "v5").mkdir()
    shutil.copy(path / "config.json", tmp_path / "v5" / "config.json")
    save_file(tensors, tmp_path / "v5" / "model.safetensors", metadata={"format": "pt"})
    prompts = random_prompts([5, 33], seed=8)
    ours = Engine(tmp_path / "v5", num_blocks=32).logits(prompts)
    torch.testing.assert_close(ours, Engine(path, num_blocks=32).logits(prompts), atol=0, rtol=0)


def test_unsupported_text_tower_fails_before_loading():
    import transformers

    from byzantium.engine.models import model_class
    config = transformers.Mistral3Config(text_config=transformers.GemmaConfig(**TINY).to_dict(),
                                         vision_config=transformers.PixtralVisionConfig(**VISION).to_dict())
    config.architectures = ["Mistral3ForConditionalGeneration"]
    with pytest.raises(ValueError, match="unsupported text tower 'gemma'"):
        model_class(config)
