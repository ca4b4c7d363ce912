"""Llama 4's text model on the engine against plain transformers (eager attention, fp32): tiny random models,
no downloads.

Four layers cover every kind: RoPE + dense, RoPE + MoE, NoPE + dense, NoPE + MoE (4 experts, top-1, and a
shared expert; dense layers with their own intermediate_size_mlp). The RoPE layers attend in chunks of 8
tokens with q/k L2 norms; the NoPE layers attend globally with temperature tuning (floor_scale 4, so it
changes the queries from position 3 on). Prompts of up to 37 tokens and 20 generated ones cross several
chunk boundaries, in prefill and in decode. Variants: the text-only checkpoint (Llama4ForCausalLM) on the
default CPU path, without the compiled kernels and on the torch reference; a Llama4ForConditionalGeneration
checkpoint (vision parts skipped); top-2 routing with attention biases, llama3 rope scaling and no qk norm.
The chunk mask itself is checked in the attention ops against a naive float64 computation.
"""
from types import SimpleNamespace

import pytest
import torch

from byzantium import Engine, SamplingParams
from byzantium.engine.layers.attention import PagedAttention
from byzantium.engine.models import model_class
from byzantium.engine.models.llama4 import Llama4ForCausalLM
from byzantium.engine.attention_backend import ModelFeatures, choose_attention_backend
from byzantium.kernels import cpu, reference
from conftest import random_prompts
from test_kernels import assert_matches, make_batch

LENGTHS = [3, 9, 21, 37]
NEW_TOKENS = 20
TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=48, intermediate_size_mlp=80, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
            interleave_moe_layer_step=2, no_rope_layers=[1, 1, 0, 0], attention_chunk_size=8, use_qk_norm=True,
            attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, initializer_range=0.2,
            eos_token_id=None, bos_token_id=0, pad_token_id=0)
VARIANTS = {
    "text": {},
    "multimodal": {},
    "top2": dict(num_experts_per_tok=2, attention_bias=True, use_qk_norm=False, no_rope_layers=[1, 0, 1, 0],
                 rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
}
BACKENDS = {"default": {}, "no-cpu-kernels": dict(cpu_kernels=False), "torch": dict(attention_backend="torch")}
TOL = dict(atol=1e-4, rtol=1e-4)  # fp32 logits


def build(variant, **changes):
    """A random transformers Llama 4 of `variant` (eager attention), norm weights random too (ones by default)."""
    import transformers
    text = {**TEXT, **VARIANTS[variant], **changes}
    torch.manual_seed(11)
    if variant == "multimodal":
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                      patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=64)
        config = transformers.Llama4Config(text_config=text, vision_config=vision, image_token_index=255,
                                           boi_token_index=253, eoi_token_index=254)
        config._attn_implementation = "eager"
        config.text_config._attn_implementation = "eager"
        model = transformers.Llama4ForConditionalGeneration(config)
    else:
        model = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**text, attn_implementation="eager"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.3)
    return model.eval()


def hf_logits(hf, prompts):
    with torch.no_grad():
        return torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in prompts])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """variant -> (transformers model, saved directory, prompts, expected greedy tokens, expected last logits)."""
    out = {}
    for i, variant in enumerate(VARIANTS):
        hf = build(variant)
        path = tmp_path_factory.mktemp(variant)
        hf.save_pretrained(path)
        prompts = random_prompts(LENGTHS, seed=i)
        # transformers' Llama4ForConditionalGeneration.forward fails without images (5.x: no image_outputs on
        # its text output): its text tower, the same weights, is the reference
        ref = hf.language_model if variant == "multimodal" else hf
        with torch.no_grad():
            tokens = [ref.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  do_sample=False)[0, len(p):].tolist() for p in prompts]
        out[variant] = (hf, path, prompts, tokens, hf_logits(ref, prompts))
    return out


def engine(path, **options):
    return Engine(path, device="cpu", dtype="float32", num_blocks=64, **options)


@pytest.mark.parametrize("variant,backend", [("text", b) for b in BACKENDS] + [("multimodal", "default"),
                                                                               ("top2", "default")])
def test_greedy_tokens_and_logits_match_transformers(models, variant, backend):
    hf, path, prompts, tokens, logits = models[variant]
    e = engine(path, **BACKENDS[backend])
    outs = e.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outs] == tokens
    assert e.stats["max_batch_seqs"] == len(prompts)  # really batched
    torch.testing.assert_close(e.logits(prompts), logits, **TOL)
    d = e.describe()
    assert d["architecture"] == type(hf).__name__ and d["model_code"].endswith("llama4.Llama4ForCausalLM")
    assert d["max_model_len"] == 512  # chunks are implemented, not a limit on the context
    # the default: the CPU kernels, which have the chunk mask (tests/test_cpu_window_models.py)
    assert d["attention_backend"] == ("cpu" if backend == "default" and cpu.available() else "torch")


def test_batched_equals_one_by_one(models):
    _, path, prompts, tokens, _ = models["text"]
    e = engine(path)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    alone = [e.generate([p], params)[0].token_ids for p in prompts]
    assert alone == [o.token_ids for o in e.generate(prompts, params)] == tokens


def test_chunked_prefill_and_mixed_steps_match(models):
    # 16-token steps: prompt pieces attend to a cached prefix across chunk boundaries, next to decode rows.
    _, path, prompts, tokens, _ = models["text"]
    e = engine(path, max_batch_tokens=16, max_num_seqs=4)
    outs = e.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outs] == tokens
    assert any(r.phase == "mixed" for r in e.step_records.records)


def test_tokens_are_not_degenerate_and_every_setting_matters(models):
    """Each feature changes transformers' logits on these prompts, so the parity above checks it."""
    hf, _, prompts, tokens, logits = models["text"]
    assert len({t for seq in tokens for t in seq}) > 30
    long = [i for i, n in enumerate(LENGTHS) if n > 8]
    for change in (dict(attention_chunk_size=4096), dict(attn_temperature_tuning=False), dict(use_qk_norm=False),
                   dict(floor_scale=8192)):
        other = build("text", **change)
        other.load_state_dict(hf.state_dict())
        assert (hf_logits(other, prompts)[long] - logits[long]).abs().amax(-1).min() > 1e-3, change
    routed = [layer.feed_forward.router.weight for layer in hf.model.layers if layer.feed_forward.__class__.__name__
              == "Llama4TextMoe"]
    assert len(routed) == 2 and len(hf.model.layers[0].feed_forward.gate_proj.weight) == 80  # dense: mlp size


def test_weights_load_from_multimodal_layouts_and_bad_checkpoints_fail(models):
    hf = models["multimodal"][0]
    state = hf.state_dict()  # the in-memory names: language_model.model.*, vision_model.*
    assert any(k.startswith("vision_model.") for k in state)
    ours = Llama4ForCausalLM(hf.config)
    ours.load_weights(state.items())
    experts = state["language_model.model.layers.1.feed_forward.experts.gate_up_proj"]  # [E, H, 2I]
    assert experts.shape == (4, 64, 96)
    assert torch.equal(ours.model.layers[1].feed_forward.w13, experts.transpose(1, 2))
    assert [layer.self_attn.attn.chunk for layer in ours.model.layers] == [8, 8, None, None]
    # transformers 5's other layout (model.language_model.*, model.vision_model.*) reads the same
    renamed = {(k.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head.", "lm_head.")
                .replace("vision_model.", "model.vision_model.")): v for k, v in state.items()}
    again = Llama4ForCausalLM(hf.config)
    again.load_weights(renamed.items())
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), again.state_dict().values()))
    with pytest.raises(ValueError, match="has no place"):
        ours.load_weights([*state.items(), ("language_model.model.layers.0.feed_forward.extra.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="missing 1 tensors"):
        ours.load_weights((k, v) for k, v in state.items() if not k.endswith("3.feed_forward.router.weight"))
    with pytest.raises(ValueError, match="has shape"):  # experts as [E, 2I, H]: the layout is checked
        ours.load_weights((k, v.transpose(1, 2) if k.endswith("experts.gate_up_proj") else v) for k, v in state.items())
    with pytest.raises(ValueError, match="stacked experts"):
        ours.load_weights((k, v[:2] if k.endswith("experts.down_proj") else v) for k, v in state.items())


def test_unsupported_settings_fail_clearly(models):
    import transformers
    config = transformers.Llama4TextConfig(**{**TEXT, "hidden_act": "gelu"})
    config.architectures = ["Llama4ForCausalLM"]
    assert model_class(config) is Llama4ForCausalLM
    with pytest.raises(ValueError, match="unsupported hidden_act 'gelu'"):
        Llama4ForCausalLM(config)
    config = transformers.Llama4TextConfig(**TEXT)  # no architectures: found by model_type llama4_text
    assert model_class(config) is Llama4ForCausalLM
    config.layer_types = ["sliding_attention"] * 4
    with pytest.raises(ValueError, match="unsupported Llama 4 layer_types"):
        Llama4ForCausalLM(config)


def test_backends_without_chunked_attention_fail_clearly(models):
    # flash-attn has no chunk mask: a chunked layer says so rather than attend globally.
    meta = SimpleNamespace(ops=SimpleNamespace(__name__="byzantium.kernels.flash"), num_decode=1)
    q = torch.zeros(1, 4, 16)
    with pytest.raises(ValueError, match="'flash_attn' has no chunked attention.*attention_chunk_size=8"):
        PagedAttention(0.25, chunk=8)(q, q, q, meta, None, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("variant", ["text", "top2"])
def test_on_cuda_matches_transformers(models, variant):
    """On a GPU, at fp32, on the default backend (the Triton kernels, with their chunk mask), with decode
    CUDA graphs: the tokens transformers gives on the CPU."""
    hf, path, prompts, tokens, logits = models[variant]
    e = Engine(path, device="cuda", dtype="float32", num_blocks=64)
    assert e.describe()["attention_backend"] == "triton"
    outs = e.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outs] == tokens
    torch.testing.assert_close(e.logits(prompts).cpu(), logits, **TOL)


@pytest.mark.parametrize("variant", ["text", "top2"])
def test_two_ranks_equal_one(models, variant):
    # Tensor parallelism (gloo, 2 ranks): heads, MLP channels and 2 of the 4 experts a rank, biases on rank 0.
    # Plain torch linears on both sides (as tests/test_tensor_parallel.py: the fastest kernel may differ
    # between a weight and its half); the K/V head split leaves one a rank.
    _, path, prompts, tokens, logits = models[variant]
    options = dict(device="cpu", dtype="float32", num_blocks=64, cpu_packed_linears=False)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    whole = Engine(path, **options)
    engine = Engine(path, tensor_parallel_size=2, **options)
    try:
        assert engine.model.num_kv_heads == 1 and len(engine.model.model.layers[1].feed_forward.experts) == 2
        split = [o.token_ids for o in engine.generate(prompts, params)]
        split_logits = engine.logits(prompts)
    finally:
        engine.close()
    assert split == [o.token_ids for o in whole.generate(prompts, params)] == tokens
    torch.testing.assert_close(split_logits, whole.logits(prompts), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(split_logits, logits, **TOL)


# ------------------------------------------------------------------------------ the chunk mask in the ops

BATCH = [(0, 37), (70, 19), (23, 1), (100, 1), (16, 16), (0, 1), (5, 3), (7, 1), (8, 1)]  # (cached, new)
DECODE = [(n - 1, 1) for n in (1, 7, 8, 9, 20, 77, 150, 33)]


def naive_chunked(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, chunk):
    """Dense float64, one query at a time, with the explicit mask: keys [p // C * C, p]."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b, total in enumerate(seq_lens.tolist()):
        start, end = cu_seqlens_q[b].item(), cu_seqlens_q[b + 1].item()
        slots = [(block_tables[b, p // block_size].item(), p % block_size) for p in range(total)]
        k = torch.stack([k_cache[blk, off] for blk, off in slots]).double().repeat_interleave(group, 1)
        v = torch.stack([v_cache[blk, off] for blk, off in slots]).double().repeat_interleave(group, 1)
        for j in range(end - start):
            p = total - (end - start) + j
            keys = slice(p // chunk * chunk, p + 1)
            for h in range(q.shape[1]):
                scores = (k[keys, h] @ q[start + j, h].double()) * scale
                out[start + j, h] = torch.softmax(scores, 0) @ v[keys, h]
    return out


@pytest.mark.parametrize("chunk", [1, 8, 20, 1000])
def test_reference_chunked_attention_matches_naive(chunk):
    data = make_batch(BATCH, 4, 2, 32, 16, torch.float32, "cpu", seed=chunk)
    out = reference.append_prefill_attention(**data, scale=0.2, chunk=chunk)
    assert_matches(out, naive_chunked(**data, scale=0.2, chunk=chunk), torch.float32)
    data = make_batch(DECODE, 4, 2, 32, 16, torch.float32, "cpu", seed=chunk + 1)
    args = [data[k] for k in ("q", "k_cache", "v_cache", "seq_lens", "block_tables")]
    out = reference.paged_decode_attention(*args, 0.2, chunk=chunk)
    assert_matches(out, naive_chunked(**data, scale=0.2, chunk=chunk), torch.float32)


@pytest.mark.skipif(not cpu.available(), reason="the compiled CPU kernels are not available here")
@pytest.mark.parametrize("chunk", [1, 8, 20, 1000])
def test_the_cpu_kernels_chunked_attention_matches_naive(chunk):
    # The compiled CPU kernels start each query's keys at its chunk's first one: "auto" takes them for
    # chunked layers (tests/test_window_attention.py checks them against the reference at every path).
    assert choose_attention_backend("auto", "cpu", features=ModelFeatures(head_dim=32, chunk=True)).name == "cpu"
    data = make_batch(BATCH, 4, 2, 32, 16, torch.float32, "cpu", seed=chunk)
    out = cpu.append_prefill_attention(**data, scale=0.2, chunk=chunk)
    assert_matches(out, naive_chunked(**data, scale=0.2, chunk=chunk), torch.float32)
    data = make_batch(DECODE, 4, 2, 32, 16, torch.float32, "cpu", seed=chunk + 1)
    args = [data[k] for k in ("q", "k_cache", "v_cache", "seq_lens", "block_tables")]
    assert_matches(cpu.paged_decode_attention(*args, 0.2, chunk=chunk), naive_chunked(**data, scale=0.2, chunk=chunk),
                   torch.float32)
