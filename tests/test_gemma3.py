"""Gemma 3 on the engine against plain transformers (eager attention): tiny random models, no downloads.

Windows of 8 and 16 tokens with prompts of up to 70 and 20 generated tokens, so sliding-window layers
attend to a window that has moved far past the start, in prefill and in decode; one variant has logit
soft-capping on; one is a Gemma3ForConditionalGeneration checkpoint (vision tower skipped), with tied
embeddings as the released checkpoints have (the text variants are untied: a tiny random tied model mostly
repeats one token). Each runs on the
engine's default CPU path (compiled kernels, window mask included), with cpu_kernels=False, and with the
torch reference.
"""
import pytest
import torch

from byzantium import Engine, SamplingParams
from byzantium.engine.models.gemma3 import Gemma3ForCausalLM
from byzantium.kernels import cpu_ext
from conftest import random_prompts

LENGTHS = [3, 11, 40, 70]
NEW_TOKENS = 20
TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=512, eos_token_id=None, bos_token_id=0,
            pad_token_id=0, initializer_range=0.2)
VARIANTS = {
    # window 8; the global layer with linear rope scaling, the local ones with their own base
    "window8": dict(num_hidden_layers=4, sliding_window=8, tie_word_embeddings=False,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
                    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                     "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}}),
    # final logit soft-capping; attn_logit_softcapping is ignored by transformers' Gemma 3, and by us
    "softcap": dict(num_hidden_layers=3, sliding_window=16, sliding_window_pattern=2, final_logit_softcapping=2.0,
                    attn_logit_softcapping=20.0, tie_word_embeddings=False),
    "multimodal": dict(num_hidden_layers=3, sliding_window=16, sliding_window_pattern=3),
}
BACKENDS = {"default": {}, "no-cpu-kernels": dict(cpu_kernels=False), "torch": dict(attention_backend="torch")}


def build(variant, **changes):
    """A random transformers Gemma 3 of `variant` (eager attention), norm weights random too (zeros by default)."""
    import transformers
    text = {**TEXT, **VARIANTS[variant], **changes}
    torch.manual_seed(7)
    if variant == "multimodal":
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                      patch_size=14)
        config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                           image_token_index=255, boi_token_index=253, eoi_token_index=254)
        config._attn_implementation = "eager"
        model = transformers.Gemma3ForConditionalGeneration(config)
    else:
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**text, attn_implementation="eager"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """variant -> (transformers model, saved directory, prompts, expected greedy tokens, expected last logits)."""
    out = {}
    for i, variant in enumerate(VARIANTS):
        hf = build(variant)
        path = tmp_path_factory.mktemp(variant)
        hf.save_pretrained(path)
        prompts = random_prompts(LENGTHS, seed=i)
        with torch.no_grad():
            tokens = [hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  do_sample=False)[0, len(p):].tolist() for p in prompts]
            logits = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in prompts])
        out[variant] = (hf, path, prompts, tokens, logits)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_and_logits_match_transformers(models, variant, backend):
    hf, path, prompts, tokens, logits = models[variant]
    engine = Engine(path, num_blocks=64, **BACKENDS[backend])
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outs] == tokens
    assert engine.stats["max_batch_seqs"] == len(prompts)  # really batched
    torch.testing.assert_close(engine.logits(prompts), logits, atol=1e-4, rtol=1e-4)
    if variant == "softcap":
        assert float(logits.abs().max()) < 2.0  # capped
    d = engine.describe()
    assert d["architecture"] == type(hf).__name__ and d["model_code"].endswith("gemma3.Gemma3ForCausalLM")
    assert d["max_model_len"] == 512  # the full context: the window is implemented, not a limit
    # the default: the CPU kernels, which have the window mask (tests/test_cpu_window_models.py)
    assert d["attention_backend"] == ("cpu" if backend == "default" and cpu_ext.load() is not None else "torch")


def test_tokens_are_not_degenerate_and_the_window_matters(models):
    hf, _, prompts, tokens, logits = models["window8"]
    assert len({t for seq in tokens for t in seq}) > 30
    # The same weights with global attention everywhere give other logits for prompts past the window.
    wide = build("window8", sliding_window=4096)
    wide.load_state_dict(hf.state_dict())
    with torch.no_grad():
        wide_logits = torch.stack([wide(torch.tensor([p])).logits[0, -1] for p in prompts])
    long = [i for i, n in enumerate(LENGTHS) if n > 8]
    assert (wide_logits[long] - logits[long]).abs().amax(-1).min() > 1e-2
    short = [i for i, n in enumerate(LENGTHS) if n <= 8]
    torch.testing.assert_close(wide_logits[short], logits[short], atol=1e-5, rtol=1e-5)


def test_chunked_prefill_and_mixed_steps_match(models):
    # 16-token steps: prompt chunks attend to a cached prefix longer than the window, next to decode rows.
    _, path, prompts, tokens, _ = models["window8"]
    engine = Engine(path, num_blocks=64, max_batch_tokens=16, max_num_seqs=4)
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outs] == tokens
    assert any(r.phase == "mixed" for r in engine.step_records.records)


def test_weights_load_from_either_multimodal_layout_and_bad_checkpoints_fail(models):
    hf = models["multimodal"][0]
    # transformers' in-memory names (model.language_model.*, model.vision_tower.*), not the saved ones
    # (language_model.model.*, vision_tower.*) that the parity tests load.
    state = hf.state_dict()
    assert any(k.startswith("model.language_model.") for k in state)
    ours = Gemma3ForCausalLM(hf.config)
    ours.load_weights(state.items())
    assert torch.equal(ours.model.layers[1].self_attn.q_norm.weight,
                       state["model.language_model.layers.1.self_attn.q_norm.weight"])
    assert [layer.self_attn.attn.window for layer in ours.model.layers] == [16, 16, None]
    with pytest.raises(ValueError, match="has no place"):
        ours.load_weights([*state.items(), ("model.language_model.layers.0.mlp.extra.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="missing 1 tensors"):
        ours.load_weights((k, v) for k, v in state.items() if not k.endswith("2.pre_feedforward_layernorm.weight"))
