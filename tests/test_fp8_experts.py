"""FP8 MoE experts: the stacked w13/w2 of Qwen3-MoE and Llama 4 in e4m3 with fp32 scales per (expert,
output row), so that Llama-4-Scout (97% experts) fits one H200 and its FP8 releases load.

- fused_moe with scales against dequantize-then-reference (the CPU path dequantizes only experts that
  have tokens); the Triton kernels converting FP8 tiles as they load them, under the interpreter without a
  GPU, and compiled for sm_90 / sm_89 without spills; the dequantize-for-the-call fallback of older GPUs;
- tiny random Qwen3-MoE and Llama 4 engines with quantization="fp8": the experts FP8 (dtypes, shapes,
  bytes), quantized an expert at a time; equal to the fp32 engine on weights rounded to FP8 is
  tests/test_fp8.py's exact test (linears and experts rounded);
- Llama 4 per-expert checkpoints (llm-compressor's layout: experts.{e}.gate_proj / up_proj / down_proj):
  unquantized equal to the stacked checkpoint, and compressed-tensors FP8 ones written here (per channel:
  equal to quantizing at load; per tensor and a Scout-like ignore list: close to fp32);
- tensor parallelism: two ranks equal one with FP8 experts, quantized at load and read from the
  per-expert FP8 checkpoint (each rank reads only its experts).
"""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from byzantium import Engine, SamplingParams
from byzantium.engine.layers import fp8 as fp8_layer
from byzantium.engine.layers.fp8 import FP8, Fp8Linear, quantize_rows
from byzantium.kernels import moe as moe_kernels
from byzantium.kernels.moe import dequantize_experts, fused_moe, moe_reference
from conftest import random_prompts, reordered_sums_tolerance
from test_moe import HAS_TRITON, INTERPRET, uneven_case

PROMPTS = random_prompts([3, 9, 17, 31, 40], seed=7)
TP = dict(device="cpu", dtype="float32", num_blocks=64, cpu_packed_linears=False)
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def rel_err(a, b):
    return ((a.float() - b.float()).norm(dim=-1) / b.float().norm(dim=-1))


def quantize_experts(w):
    """Stacked weights [E, rows, cols] as the engine holds FP8 experts: (e4m3 [E, rows, cols], scales [E, rows])."""
    experts, rows, cols = w.shape
    q, scale = quantize_rows(w.reshape(-1, cols))
    return q.view(experts, rows, cols), scale.view(experts, rows)


def dequantized(q, scale):
    return q.float() * scale[..., None]


def round_experts_to_fp8(hf):
    """Round a transformers model's stacked experts to FP8 and back, in place, as the engine quantizes them
    (per expert and output row). Qwen3-MoE keeps them as ours (gate_up_proj [E, 2I, H], down_proj [E, H, I]);
    Llama 4 transposed (gate_up_proj [E, H, 2I], down_proj [E, I, H]). Returns how many tensors it rounded."""
    count = 0
    with torch.no_grad():
        for name, module in hf.named_modules():
            if not name.endswith(".experts") or not hasattr(module, "gate_up_proj"):
                continue
            transposed = type(module).__name__.startswith("Llama4")
            for param in (module.gate_up_proj, module.down_proj):
                ours = param.transpose(1, 2) if transposed else param
                rounded = dequantized(*quantize_experts(ours))
                param.copy_(rounded.transpose(1, 2) if transposed else rounded)
                count += 1
    return count


def expert_blocks(engine):
    return [m for m in engine.model.modules() if hasattr(m, "w13") and hasattr(m, "w2")]


def fp8_layers(engine):
    return {name for name, m in engine.model.named_modules() if isinstance(m, Fp8Linear)}


# ------------------------------------------------------------------------------------------ the kernels

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_moe_with_scales_is_dequantize_then_reference(dtype, monkeypatch):
    x, w13, w2, weights, ids = uneven_case(23)
    (q13, s13), (q2, s2) = quantize_experts(w13), quantize_experts(w2)
    x, weights = x.to(dtype), weights.to(dtype)
    used = []
    real = moe_kernels.expert_weight
    monkeypatch.setattr(moe_kernels, "expert_weight", lambda w, s, e, d: used.append(e) or real(w, s, e, d))
    out = fused_moe(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
    # experts 0, 1, 2 and 6 have no token: never dequantized
    assert sorted(set(used)) == [3, 4, 5, 7] and len(used) == 8
    expected = moe_reference(x, dequantized(q13, s13).to(dtype), dequantized(q2, s2).to(dtype), weights, ids)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0)  # the same weights, the same ops


def test_dequantize_experts_an_expert_at_a_time():
    w = torch.randn(5, 24, 40) * torch.logspace(-3, 1, 5)[:, None, None]
    q, scale = quantize_experts(w)
    for dtype in (torch.float32, torch.bfloat16):
        out = dequantize_experts(q, scale, dtype)
        assert out.dtype == dtype and torch.equal(out, dequantized(q, scale).to(dtype))
    # each weight within half an e4m3 ulp of itself (2^-4 relative), or of the subnormal step near zero
    bound = torch.maximum(w.abs() * 2 ** -4, scale[..., None] * 2 ** -10) * (1 + 1e-6)
    assert ((dequantized(q, scale) - w).abs() <= bound).all()


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.skipif(INTERPRET or torch.cuda.is_available(), reason="TestTritonFp8Moe runs in this process")
def test_triton_fp8_moe_under_interpreter():
    """TestTritonFp8Moe in a fresh process with TRITON_INTERPRET=1 set before triton is imported."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{os.path.abspath(__file__)}::TestTritonFp8Moe"]
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]


FP8_CUDA = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not HAS_TRITON or not (INTERPRET or FP8_CUDA),
                    reason="needs TRITON_INTERPRET=1 (run by the test above) or a GPU of compute capability >= 8.9")
class TestTritonFp8Moe:
    """The kernels on FP8 experts against the reference on the same FP8 experts. fp32 and fp16 activations:
    the interpreter has no bf16 arithmetic (on a GPU bf16 too). The scale is applied to the fp32 accumulator
    rather than to each weight, so fp32 agrees to rounding (measured 2e-7 - 9e-7 absolute)."""
    DEVICE = "cpu" if INTERPRET else "cuda"
    DTYPES = [torch.float32, torch.float16] + ([] if INTERPRET else [torch.bfloat16])
    TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}

    @pytest.mark.parametrize("block_m", [16, 64])
    @pytest.mark.parametrize("num_tokens", [1, 5, 77])
    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    def test_in_kernel_dequantization(self, num_tokens, block_m, dtype):
        from byzantium.kernels.triton_moe import fused_moe_triton
        x, w13, w2, weights, ids = uneven_case(num_tokens)
        (q13, s13), (q2, s2) = quantize_experts(w13), quantize_experts(w2)
        x, weights = x.to(dtype), weights.to(dtype)
        expected = moe_reference(x.float(), q13, q2, weights.float(), ids, s13, s2)
        dev = [t.to(self.DEVICE) for t in (x, q13, q2, weights, ids, s13, s2)]
        out = fused_moe_triton(*dev[:5], block_m=block_m, w13_scale=dev[5], w2_scale=dev[6])
        assert out.dtype == dtype and not out.isnan().any()
        torch.testing.assert_close(out.float().cpu(), expected, rtol=self.TOL[dtype], atol=self.TOL[dtype])

    def test_dequantized_for_the_call_is_the_same(self):
        """The path of GPUs without e4m3 in Triton (moe.fused_moe: dequantize_experts, then the kernels)."""
        from byzantium.kernels.triton_moe import fused_moe_triton
        x, w13, w2, weights, ids = (t.to(self.DEVICE) for t in uneven_case(40))
        (q13, s13), (q2, s2) = quantize_experts(w13), quantize_experts(w2)
        in_kernel = fused_moe_triton(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
        before = fused_moe_triton(x, dequantize_experts(q13, s13, x.dtype), dequantize_experts(q2, s2, x.dtype),
                                  weights, ids)
        torch.testing.assert_close(in_kernel, before, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(INTERPRET, reason="compiling, not interpreting")
@pytest.mark.parametrize("arch", [90, 89])
def test_triton_fp8_moe_kernels_compile_without_spills(arch):
    """bf16 and fp16 activations over FP8 experts, decode- and prefill-sized tiles, compiled for Hopper and
    Ada with no GPU here (kernels/aot.py)."""
    pytest.importorskip("triton")
    from byzantium.kernels import aot
    from byzantium.kernels.triton_moe import fused_moe_triton
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        assert os.path.exists(get_ptxas(arch).path)
    except Exception as e:  # noqa: BLE001 - a triton wheel without the NVIDIA tools
        pytest.skip(f"no ptxas in this triton: {e}")
    experts, hidden, inter, top_k = 8, 256, 128, 2
    w13, w2 = torch.zeros(experts, 2 * inter, hidden, dtype=FP8), torch.zeros(experts, hidden, inter, dtype=FP8)
    s13, s2 = torch.ones(experts, 2 * inter), torch.ones(experts, hidden)
    for dtype in (torch.bfloat16, torch.float16):
        for tokens in (4, 512):
            x = torch.zeros(tokens, hidden, dtype=dtype)
            ids = torch.arange(tokens * top_k).remainder(experts).view(tokens, top_k)
            with warnings.catch_warnings(), aot.offline_target(arch) as compiled:
                warnings.simplefilter("ignore")
                fused_moe_triton(x, w13, w2, torch.ones(tokens, top_k, dtype=dtype), ids, w13_scale=s13, w2_scale=s2)
            assert len(compiled) == 2
            for c in compiled:
                use = aot.usage(c)
                assert not use["spill_stores"] and not use["spill_loads"] and use["shared"] <= aot.SHARED_LIMIT[arch], \
                    (c.name, dtype, tokens, use)


# ------------------------------------------------------------------------------- engines, checkpoints

def build(kind):
    if kind == "qwen3-moe":
        from test_tensor_parallel import build as build_tp
        return build_tp("qwen3-moe")
    from test_llama4 import build as build_llama4
    return build_llama4(kind)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """kind -> (transformers model, saved directory), built once."""
    cache = {}

    def get(kind):
        if kind not in cache:
            hf = build(kind)
            path = tmp_path_factory.mktemp(kind)
            hf.save_pretrained(path)
            cache[kind] = (hf, path)
        return cache[kind]
    return get


@pytest.mark.parametrize("kind", ["qwen3-moe", "text"])
def test_experts_are_fp8_and_quantized_an_expert_at_a_time(kind, saved, monkeypatch, tmp_path):
    hf, path = saved(kind)
    calls = []
    real = fp8_layer.quantize_rows
    monkeypatch.setattr(fp8_layer, "quantize_rows", lambda t, s=None: calls.append(tuple(t.shape)) or real(t, s))
    engine = Engine(path, num_blocks=64, quantization="fp8")
    whole = Engine(path, num_blocks=64)
    blocks, fp32_blocks = expert_blocks(engine), expert_blocks(whole)
    assert len(blocks) == 2
    fp8_bytes = fp32_bytes = 0
    for block, fp32 in zip(blocks, fp32_blocks):
        experts, two_inter, hidden = block.w13.shape
        assert block.w13.dtype == block.w2.dtype == FP8 and block.w2.shape == (experts, hidden, two_inter // 2)
        assert block.w13_scale.dtype == block.w2_scale.dtype == torch.float32
        assert block.w13_scale.shape == (experts, two_inter) and block.w2_scale.shape == (experts, hidden)
        assert (block.w13_scale > 0).all() and (block.w2_scale > 0).all()
        # the weights, as stored: the fp32 model's quantized per (expert, row)
        for ours, scale, theirs in ((block.w13, block.w13_scale, fp32.w13), (block.w2, block.w2_scale, fp32.w2)):
            q, s = quantize_experts(theirs)
            assert torch.equal(ours.view(torch.uint8), q.view(torch.uint8)) and torch.equal(scale, s)
        fp8_bytes += sum(t.numel() * t.element_size() for t in (block.w13, block.w2, block.w13_scale, block.w2_scale))
        fp32_bytes += sum(t.numel() * t.element_size() for t in (fp32.w13, fp32.w2))
        assert fp32.w13_scale is None and fp32.w13.dtype == torch.float32
    # one byte a weight and four a row: a quarter of fp32 (half of bf16) plus 4 bytes / in_features
    experts, hidden, inter = blocks[0].w2.shape
    assert fp8_bytes == 2 * experts * (3 * inter * hidden + 4 * (2 * inter + hidden))
    assert fp8_bytes < 0.3 * fp32_bytes
    # quantized an expert at a time: expert-sized pieces (Qwen3-MoE's checkpoint: gate, up and down of each;
    # Llama 4's stacked one: each expert's [gate; up] and down), never a layer's experts together
    pieces = {(2 * inter, hidden), (inter, hidden), (hidden, inter)}
    assert sum(shape in pieces for shape in calls) >= 2 * 2 * experts
    assert max(rows * cols for rows, cols in calls) < experts * inter * hidden, sorted(set(calls))
    assert engine.describe()["quantization"] == "fp8"
    assert engine.describe()["quantization_source"] == "quantized at load"
    # What FP8 experts cost in accuracy: against the fp32 engine on a checkpoint with only the linears
    # rounded to FP8 (the tiny Llama 4, initializer_range 0.2 and random norms, is off by 8-21% from its
    # linears alone), the next-token logits measure 0.7-2.5% relative L2 error (Llama 4, top-1 of 4 experts
    # scaling its input) and 0.2-0.4% (Qwen3-MoE, top-2 of 8 experts): 0.05 is twice the worst
    linears_rounded = build(kind)
    round_linears_to_fp8(linears_rounded)
    linears_rounded.save_pretrained(tmp_path / "rounded")
    error = rel_err(engine.logits(PROMPTS), Engine(tmp_path / "rounded", num_blocks=64).logits(PROMPTS))
    assert 1e-4 < error.max() < 0.05, error


def round_linears_to_fp8(hf):
    """Round a transformers model's decoder linears to FP8 and back, in place (tests/test_fp8.py's exact test)."""
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if param.dim() == 2 and name.removesuffix(".weight").rsplit(".", 1)[-1] in LINEAR:
                q, scale = quantize_rows(param)
                param.copy_(q.float() * scale[:, None])


def per_expert_state(hf_state, quantize=None, text_only=True):
    """A Llama 4 state dict with the stacked experts unpacked into llm-compressor's per-expert linears
    (experts.{e}.gate_proj / up_proj / down_proj .weight, [out, in]); with `quantize(weight) -> {suffix:
    tensor}`, every text decoder linear (not the router) and expert stored through it."""
    out = {}
    for name, tensor in hf_state.items():
        if name.endswith("experts.gate_up_proj"):  # [E, H, 2I]
            prefix, inter = name.removesuffix("gate_up_proj"), tensor.shape[2] // 2
            for e in range(tensor.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = tensor[e, :, :inter].T
                out[f"{prefix}{e}.up_proj.weight"] = tensor[e, :, inter:].T
        elif name.endswith("experts.down_proj"):  # [E, I, H]
            prefix = name.removesuffix("down_proj")
            for e in range(tensor.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = tensor[e].T
        else:
            out[name] = tensor
    if quantize is None:
        return {k: v.contiguous() for k, v in out.items()}
    stored = {}
    for name, tensor in out.items():
        module, _, leaf = name.rpartition(".")
        text = ".layers." in name and "vision" not in name
        if leaf == "weight" and text and module.rsplit(".", 1)[-1] in LINEAR:
            stored |= {f"{module}.{suffix}": t.contiguous() for suffix, t in quantize(tensor).items()}
        else:
            stored[name] = tensor.contiguous()
    return stored


def per_channel(weight):
    q, scale = quantize_rows(weight)
    return {"weight": q, "weight_scale": scale[:, None]}  # [out, 1], as compressed-tensors stores it


def per_tensor(weight):
    scale = weight.abs().max().float() / 448
    return {"weight": (weight / scale).clamp(-448, 448).to(FP8), "weight_scale": scale.reshape(1)}


def ct_config(strategy="channel", ignore=("re:.*lm_head", "re:.*router")):
    """compressed-tensors FP8-dynamic as llm-compressor writes it (RedHatAI's Llama-4-Scout release: weights
    per channel, activations per token)."""
    weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False,
               "group_size": None, "block_structure": None, "observer": "minmax"}
    acts = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                          "output_activations": None}},
            "ignore": list(ignore), "kv_cache_scheme": None, "sparsity_config": {}}


def write(source, dest, tensors, qc=None):
    dest.mkdir()
    config = json.loads((source / "config.json").read_text())
    if qc is not None:
        config["quantization_config"] = qc
    (dest / "config.json").write_text(json.dumps(config))
    save_file(tensors, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def checkpoint_state(path):
    state = {}
    for file in sorted(path.glob("*.safetensors")):
        state |= load_file(file)
    return state


@pytest.mark.parametrize("kind", ["text", "multimodal"])
def test_llama4_per_expert_checkpoint_equals_stacked(kind, saved, tmp_path):
    _, path = saved(kind)
    state = checkpoint_state(path)
    assert any(k.endswith("experts.gate_up_proj") for k in state)
    unpacked = per_expert_state(state)
    assert any(k.endswith("experts.3.down_proj.weight") for k in unpacked)
    ours = Engine(write(path, tmp_path / "per-expert", unpacked), num_blocks=64)
    torch.testing.assert_close(ours.logits(PROMPTS), Engine(path, num_blocks=64).logits(PROMPTS), rtol=0, atol=0)


@pytest.fixture(scope="module")
def llama4_fp8(saved, tmp_path_factory):
    """The multimodal Llama 4 (Scout's checkpoint layout) as a per-expert, per-channel FP8 compressed-tensors
    checkpoint, and the engine quantizing its bf16 checkpoint at load."""
    _, path = saved("multimodal")
    ckpt = write(path, tmp_path_factory.mktemp("ct") / "ckpt", per_expert_state(checkpoint_state(path), per_channel),
                 ct_config())
    return ckpt, Engine(path, num_blocks=64, quantization="fp8")


def test_llama4_per_expert_fp8_checkpoint_equals_quantizing_at_load(llama4_fp8):
    ckpt, at_load = llama4_fp8
    stored = load_file(ckpt / "model.safetensors")
    (up,) = [k for k in stored if k.endswith("layers.1.feed_forward.experts.2.up_proj.weight")]
    (router,) = [k for k in stored if k.endswith("layers.1.feed_forward.router.weight")]
    assert stored[up].dtype == FP8 and stored[up.replace(".weight", ".weight_scale")].shape == (48, 1)
    assert stored[router].dtype == torch.float32
    engine = Engine(ckpt, num_blocks=64)  # no option: the checkpoint says FP8
    assert engine.describe()["quantization"] == "fp8"
    assert engine.describe()["quantization_source"] == "as published (compressed-tensors)"
    assert fp8_layers(engine) == fp8_layers(at_load) and fp8_layers(engine)
    for ours, theirs in zip(expert_blocks(engine), expert_blocks(at_load)):
        assert ours.w13.dtype == ours.w2.dtype == FP8
        for name in ("w13", "w2", "w13_scale", "w2_scale"):
            a, b = getattr(ours, name), getattr(theirs, name)
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype == FP8 else torch.equal(a, b), name
    # the same per-row quantization, read instead of computed
    torch.testing.assert_close(engine.logits(PROMPTS), at_load.logits(PROMPTS), rtol=1e-5, atol=1e-5)


def dequantized_checkpoint(tensors):
    """A checkpoint's FP8 weights multiplied out by their scales (per channel [out, 1] or per tensor [1]),
    in fp32, without the scales: the weights an FP8 engine multiplies by, as an unquantized checkpoint."""
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(".weight_scale"):
            continue
        if tensor.dtype == FP8:
            scale = tensors[name + "_scale"].float()
            tensor = tensor.float() * (scale.reshape(()) if scale.numel() == 1 else scale.reshape(-1, 1))
        out[name] = tensor.contiguous()
    return out


@pytest.mark.parametrize("variant", ["per-tensor", "scout-ignore-list"])
def test_llama4_per_expert_fp8_checkpoint_variants(variant, saved, tmp_path):
    """Per-tensor scales (one per expert linear, copied to its rows); and the ignore list of llm-compressor's
    Llama 4 recipes (attention, routers, vision parts and the head kept in bf16; a class name as an entry):
    the experts and the shared experts FP8, the attention not. Both exact (on the CPU, in fp32) against the
    fp32 engine on the same checkpoint multiplied out."""
    _, path = saved("multimodal")
    state = checkpoint_state(path)
    if variant == "per-tensor":
        qc, quantize = ct_config("tensor"), per_tensor
    else:
        qc = ct_config(ignore=["re:.*lm_head", "re:.*self_attn", "re:.*router", "re:.*vision_model.*",
                               "re:.*multi_modal_projector.*", "Llama4TextAttention"])

        def quantize(weight):  # what the recipe leaves out stays as it is; the writer below skips self_attn
            return per_channel(weight)
    tensors = per_expert_state(state, quantize)
    if variant == "scout-ignore-list":  # the attention linears stored unquantized, as the release does
        unpacked = per_expert_state(state)
        tensors = {k: v for k, v in tensors.items() if "self_attn" not in k}
        tensors |= {k: v for k, v in unpacked.items() if "self_attn" in k}
    engine = Engine(write(path, tmp_path / variant, tensors, qc), num_blocks=64)
    blocks = expert_blocks(engine)
    assert blocks and all(b.w13.dtype == FP8 and b.w2.dtype == FP8 for b in blocks)
    names = fp8_layers(engine)
    assert any("shared_expert" in n for n in names)
    assert any("self_attn" in n for n in names) == (variant == "per-tensor")
    if variant == "per-tensor":
        scale = blocks[0].w13_scale
        assert (scale[0, :scale.shape[1] // 2] == scale[0, 0]).all() and scale[0, 0] != scale[0, -1]  # gate, up
    fp32 = Engine(write(path, tmp_path / "multiplied-out", dequantized_checkpoint(tensors)), num_blocks=64)
    assert not expert_blocks(fp32)[0].w13.dtype == FP8
    assert rel_err(engine.logits(PROMPTS), fp32.logits(PROMPTS)).max() < 1e-5


def test_llama4_fp8_experts_kept_when_the_config_ignores_them(saved, tmp_path):
    """An FP8 checkpoint whose config leaves the experts out (ignored) but stores them in FP8 anyway: they
    are dequantized on the way in and held in the compute dtype, as the same experts rounded and stored in
    fp32 would be."""
    _, path = saved("text")
    state = checkpoint_state(path)
    fp8_everywhere = per_expert_state(state, per_channel)
    engine = Engine(write(path, tmp_path / "ignored", fp8_everywhere,
                          ct_config(ignore=["re:.*lm_head", "re:.*router", "re:.*experts.*"])), num_blocks=64)
    blocks = expert_blocks(engine)
    assert all(b.w13.dtype == torch.float32 and b.w13_scale is None for b in blocks)
    assert fp8_layers(engine)  # the other linears are FP8
    reference = Engine(write(path, tmp_path / "all", fp8_everywhere, ct_config()), num_blocks=64)
    torch.testing.assert_close(engine.logits(PROMPTS), reference.logits(PROMPTS), rtol=1e-4, atol=1e-4)


def tp_outputs(engine, prompts):
    return ([o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))],
            engine.logits(prompts))


@pytest.mark.parametrize("source", ["qwen3-moe at load", "llama4 at load", "llama4 per-expert fp8 checkpoint"])
def test_two_ranks_equal_one_with_fp8_experts(source, saved, llama4_fp8):
    if source == "qwen3-moe at load":
        path, options = saved("qwen3-moe")[1], dict(quantization="fp8")
    elif source == "llama4 at load":
        path, options = saved("text")[1], dict(quantization="fp8")
    else:
        path, options = llama4_fp8[0], {}
    whole = Engine(path, **TP, **options)
    want_tokens, want_logits = tp_outputs(whole, PROMPTS)
    layers = whole.model.config.num_hidden_layers
    engine = Engine(path, tensor_parallel_size=2, **TP, **options)
    try:
        blocks = expert_blocks(engine)
        assert all(b.w13.dtype == FP8 and len(b.experts) == b.num_experts // 2 for b in blocks)
        tokens, logits = tp_outputs(engine, PROMPTS)
    finally:
        engine.close()
    assert tokens == want_tokens
    torch.testing.assert_close(logits, want_logits, **reordered_sums_tolerance(want_logits, layers))
