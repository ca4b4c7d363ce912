"""Qwen3-MoE: the expert kernels and the model against plain transformers.

- `moe_reference` (the CPU path and the oracle) against a naive per-token loop in float64.
- The Triton kernels (`kernels/triton_moe.py`) against the reference on uneven expert loads: some experts
  with no token, one with most, tiles straddling expert boundaries. On CUDA they run in this process;
  without it `test_triton_moe_under_interpreter` reruns `TestTritonMoe` in a fresh process with
  TRITON_INTERPRET=1 set before triton is imported (fp32: what the interpreter computes exactly).
- Tiny random Qwen3-MoE models (8 experts, top-2, norm_topk_prob on and off, dense layers by
  mlp_only_layers and by decoder_sparse_step) saved by transformers and served by our engine: the same
  greedy tokens over a batch of ragged prompts, logits within 1e-4, on prompts that route unevenly.
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from byzantium import Engine, SamplingParams
from byzantium.kernels.moe import fused_moe, moe_reference
from conftest import TINY, random_prompts

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
TRITON_DEVICE = "cpu" if INTERPRET else "cuda" if torch.cuda.is_available() else None
# the interpreter has no bf16 arithmetic; half precision is compared with the reference in fp32 on the same
# rounded inputs (the kernels round the SiLU * up activations to the input dtype between the two GEMMs)
TRITON_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if TRITON_DEVICE == "cuda" else [])
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def naive_moe(x, w13, w2, topk_weights, topk_ids):
    """Token by token, choice by choice, in float64."""
    x, w13, w2, topk_weights = (t.double() for t in (x, w13, w2, topk_weights))
    inter = w2.shape[-1]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gate_up = w13[e] @ x[t]
            h = torch.nn.functional.silu(gate_up[:inter]) * gate_up[inter:]
            out[t] += topk_weights[t, j] * (w2[e] @ h)
    return out


def uneven_case(num_tokens, num_experts=8, top_k=2, hidden=48, inter=40, seed=0, device="cpu"):
    """Expert 3 takes every token's first choice; the second choices go to experts 4, 5 and (once) 7:
    experts 0, 1, 2 and 6 get no token. hidden and inter are not multiples of the kernels' tiles."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=g)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) * hidden ** -0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) * inter ** -0.5
    ids = torch.empty(num_tokens, top_k, dtype=torch.long)
    ids[:, 0] = 3
    ids[:, 1] = 4 + torch.randint(0, 2, (num_tokens,), generator=g)
    ids[-1, 1] = 7
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=g), dim=-1)
    return [t.to(device) for t in (x, w13, w2, weights, ids)]


@pytest.mark.parametrize("num_tokens", [1, 5, 77])
def test_reference_matches_naive_loop(num_tokens):
    case = uneven_case(num_tokens)
    torch.testing.assert_close(moe_reference(*case).double(), naive_moe(*case), atol=1e-5, rtol=1e-5)
    assert torch.equal(fused_moe(*case), moe_reference(*case))  # the CPU dispatch is the reference


def test_reference_random_routing_top_4():
    g = torch.Generator().manual_seed(5)
    x, w13, w2 = torch.randn(30, 32, generator=g), torch.randn(16, 48, 32, generator=g), torch.randn(16, 32, 24, generator=g)
    ids = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(30)])
    weights = torch.rand(30, 4, generator=g)
    torch.testing.assert_close(moe_reference(x, w13, w2, weights, ids).double(), naive_moe(x, w13, w2, weights, ids),
                               atol=1e-4, rtol=1e-5)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.skipif(INTERPRET or torch.cuda.is_available(), reason="TestTritonMoe runs in this process")
def test_triton_moe_under_interpreter():
    """Run TestTritonMoe in a fresh process with TRITON_INTERPRET=1 set before triton is imported."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{os.path.abspath(__file__)}::TestTritonMoe"]
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"Triton MoE tests failed under the interpreter:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_align_counts_with_no_host_sync(monkeypatch):
    """align's plan is pure torch: on the CPU the same as a sort by expert, and it never calls
    torch.bincount (which syncs with the host on CUDA and breaks CUDA-graph capture)."""
    from byzantium.kernels.triton_moe import align

    def bincount(*a, **k):
        raise AssertionError("torch.bincount syncs with the host on CUDA")
    monkeypatch.setattr(torch, "bincount", bincount)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 8, (37, 2), generator=g)
    pairs, tile_expert = align(ids, 8, 16)
    flat = ids.reshape(-1)
    for tile, expert in enumerate(tile_expert.tolist()):
        rows = [p for p in pairs.view(-1, 16)[tile].tolist() if p != flat.numel()]
        assert expert == -1 and not rows or all(flat[p] == expert for p in rows)
    real = sorted(p for p in pairs.tolist() if p != flat.numel())
    assert real == list(range(flat.numel()))  # every pair once


@pytest.mark.skipif(not HAS_TRITON or TRITON_DEVICE is None,
                    reason="no CUDA: run by test_triton_moe_under_interpreter in a fresh process")
class TestTritonMoe:
    @pytest.mark.parametrize("block_m", [16, 64])
    @pytest.mark.parametrize("num_tokens", [1, 5, 77])
    def test_uneven_loads(self, num_tokens, block_m):
        from byzantium.kernels.triton_moe import fused_moe_triton
        case = uneven_case(num_tokens, device=TRITON_DEVICE)
        out = fused_moe_triton(*case, block_m=block_m)
        assert not out.isnan().any()
        torch.testing.assert_close(out.cpu(), moe_reference(*(t.cpu() for t in case)), atol=1e-4, rtol=1e-4)

    @pytest.mark.parametrize("dtype", TRITON_DTYPES, ids=str)
    def test_dtypes(self, dtype):
        from byzantium.kernels.triton_moe import fused_moe_triton
        case = uneven_case(40, device=TRITON_DEVICE)
        case[:4] = [t.to(dtype) for t in case[:4]]
        out = fused_moe_triton(*case)
        assert out.dtype == dtype and not out.isnan().any()
        ref = moe_reference(*(t.float().cpu() for t in case[:4]), case[4].cpu())
        torch.testing.assert_close(out.float().cpu(), ref, atol=TOL[dtype], rtol=TOL[dtype])

    def test_align_groups_pairs_by_expert(self):
        from byzantium.kernels.triton_moe import align
        ids = torch.tensor([[3, 4], [3, 5], [3, 4], [0, 3]], device=TRITON_DEVICE)
        pairs, tile_expert = align(ids, 8, 16)
        pairs, tile_expert = pairs.cpu().view(-1, 16), tile_expert.cpu()
        assert tile_expert.tolist()[:4] == [0, 3, 4, 5] and set(tile_expert.tolist()[4:]) == {-1}
        assert pairs[1, :4].tolist() == [0, 2, 4, 7] and set(pairs[1, 4:].tolist()) == {8}  # 8: padding
        assert pairs[0, 0] == 6 and pairs[2, :2].tolist() == [1, 5] and pairs[3, 0] == 3

    def test_random_routing_top_4_many_tokens(self):
        from byzantium.kernels.triton_moe import fused_moe_triton
        g = torch.Generator().manual_seed(5)
        x = torch.randn(130, 64, generator=g)
        w13, w2 = torch.randn(16, 96, 64, generator=g) / 8, torch.randn(16, 64, 48, generator=g) / 7
        ids = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(130)])
        weights = torch.rand(130, 4, generator=g)
        out = fused_moe_triton(*(t.to(TRITON_DEVICE) for t in (x, w13, w2, weights, ids)))
        torch.testing.assert_close(out.cpu(), moe_reference(x, w13, w2, weights, ids), atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------ the model vs transformers

MOE = dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, head_dim=16)
VARIANTS = {  # name -> config overrides
    "norm-topk-dense-middle": dict(num_hidden_layers=3, norm_topk_prob=True, mlp_only_layers=[1]),
    "no-norm-sparse-step-2": dict(num_hidden_layers=2, norm_topk_prob=False, decoder_sparse_step=2),
}
LENGTHS = [3, 9, 16, 17, 31, 40]


def build_tiny_moe(**overrides):
    import transformers
    torch.manual_seed(1234)
    config = transformers.Qwen3MoeConfig(**dict(TINY, **MOE, **overrides))
    return transformers.Qwen3MoeForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny_moes(tmp_path_factory):
    models = {}
    for name, overrides in VARIANTS.items():
        model = build_tiny_moe(**overrides)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        models[name] = (model, path)
    return models


def skewed_prompts(lengths, seed):
    """Prompts of a few repeated tokens: similar hidden states, so the router sends most of them to the
    same experts (the test checks that it does)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.tensor([5, 9, 5, 5, 17])[torch.randint(0, 5, (n,), generator=g)].tolist() for n in lengths]


def expert_loads(hf, prompts):
    """Pairs routed to each expert, per sparse layer, over all prompts (transformers' router)."""
    loads = {}

    def hook(module, args, output):
        loads.setdefault(id(module), []).append(torch.bincount(output[2].reshape(-1), minlength=8))
    handles = [layer.mlp.gate.register_forward_hook(hook) for layer in hf.model.layers if hasattr(layer.mlp, "gate")]
    with torch.no_grad():
        for p in prompts:
            hf(torch.tensor([p]))
    for h in handles:
        h.remove()
    return [sum(counts) for counts in loads.values()]


def hf_greedy(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_moe_layers_follow_the_config(tiny_moes, variant):
    from byzantium.engine.models.moe import SparseMoeBlock
    hf, path = tiny_moes[variant]
    engine = Engine(path, num_blocks=64)
    ours = [isinstance(layer.mlp, SparseMoeBlock) for layer in engine.model.model.layers]
    assert ours == [hasattr(layer.mlp, "experts") for layer in hf.model.layers]
    assert any(ours) and not all(ours)
    assert engine.describe()["architecture"] == "Qwen3MoeForCausalLM"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_and_logits_match_transformers(tiny_moes, variant):
    hf, path = tiny_moes[variant]
    engine = Engine(path, num_blocks=128)
    skewed = skewed_prompts(LENGTHS, seed=1)
    for load in expert_loads(hf, skewed):  # uneven: idle experts, one with far more than its share
        assert load.min() == 0 and load.max() >= 2 * load.sum() / 8, load.tolist()
    prompts = skewed + random_prompts([7, 23], seed=2)  # and two prompts routed all over
    outputs = engine.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    assert engine.stats["max_batch_seqs"] == len(prompts)
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == hf_greedy(hf, prompt, 16)
    ours = engine.logits(prompts)
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            torch.testing.assert_close(ours[i], hf(torch.tensor([prompt])).logits[0, -1], atol=1e-4, rtol=1e-4)


def _rewrite(src, dst, rename):
    """A copy of checkpoint `src` in `dst` with tensors renamed (rename returns {name: tensor} pieces)."""
    import shutil

    from safetensors.torch import load_file, save_file
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    out = {}
    for file in sorted(src.glob("*.safetensors")):
        for name, tensor in load_file(file).items():
            out.update(rename(name, tensor))
    save_file({k: v.contiguous() for k, v in out.items()}, dst / "model.safetensors", metadata={"format": "pt"})


def test_stacked_expert_checkpoint_names(tiny_moes, tmp_path):
    """transformers 5 keeps the experts stacked (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]);
    checkpoints in that layout load too, and give the same logits."""
    hf, path = tiny_moes["no-norm-sparse-step-2"]
    per_expert = {}

    def stack(name, tensor):
        parts = name.split(".")
        if ".experts." not in name:
            return {name: tensor}
        prefix, expert, proj = ".".join(parts[:parts.index("experts") + 1]), int(parts[-3]), parts[-2]
        per_expert.setdefault(prefix, {}).setdefault(proj, {})[expert] = tensor
        return {}
    _rewrite(path, tmp_path / "stacked", stack)
    from safetensors.torch import load_file, save_file
    tensors = load_file(tmp_path / "stacked" / "model.safetensors")
    for prefix, projs in per_expert.items():
        n = len(projs["gate_proj"])
        tensors[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([projs["gate_proj"][e], projs["up_proj"][e]]) for e in range(n)])
        tensors[f"{prefix}.down_proj"] = torch.stack([projs["down_proj"][e] for e in range(n)])
    save_file(tensors, tmp_path / "stacked" / "model.safetensors", metadata={"format": "pt"})
    prompts = skewed_prompts([12, 30], seed=4)
    ours = Engine(tmp_path / "stacked", num_blocks=32).logits(prompts)
    torch.testing.assert_close(ours, Engine(path, num_blocks=32).logits(prompts), atol=0, rtol=0)


def test_missing_expert_is_an_error(tiny_moes, tmp_path):
    _, path = tiny_moes["no-norm-sparse-step-2"]
    _rewrite(path, tmp_path / "broken", lambda name, t: {} if name.endswith("experts.5.up_proj.weight") else {name: t})
    with pytest.raises(ValueError, match=r"missing 1 tensors.*w13\[\(5, 1\)\]"):
        Engine(tmp_path / "broken", num_blocks=8)
