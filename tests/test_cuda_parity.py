"""The newer architectures on CUDA against transformers in fp32 on the CPU, with what a GPU promises.

The suite's engines run on the CPU unless a test names its device (conftest.cpu_unless_named); these name
CUDA and skip without it. What they assert there:
- bf16 (the CUDA default): every weight and activation is rounded to 8 significant bits (relative error
  up to 2^-9 each), and a few layers of such roundings move a logit by a few hundredths of the logits'
  scale, so last-position logits are compared at 2^-4 of the reference's largest magnitude.
- greedy tokens equal the reference's until the first step where the reference's two best logits are
  closer than that bound: there a rounding may pick the other one, and from there the sequences may part.
- fp32 on CUDA: the Triton dots run at input_precision "ieee" and torch leaves cuBLAS's TF32 off, so only
  the order of the sums differs from the CPU (a few fp32 ulps of each sum's magnitude): the CPU tests'
  1e-4 of the logits' scale, 2^-13, holds.
"""
import pytest
import torch

from byzantium import Engine, SamplingParams
from conftest import build_tiny, random_prompts

CUDA = torch.cuda.is_available()
NEW_TOKENS = 16
RELATIVE_BOUND = {torch.bfloat16: 2.0 ** -4, torch.float32: 2.0 ** -13}


def build(arch):
    """A random transformers model of each architecture the CUDA check covers, in fp32 on the CPU."""
    if arch == "llama":
        return build_tiny("llama")
    if arch == "qwen3-moe":
        from test_moe import build_tiny_moe
        return build_tiny_moe()
    if arch == "gemma3":
        from test_gemma3 import build
        return build("window8")
    if arch == "mistral3":
        from test_mistral3 import build_tiny_mistral3
        return build_tiny_mistral3()
    raise ValueError(f"no builder for {arch!r}")


def reference(hf, prompt, n):
    """transformers' greedy tokens, the last prompt position's logits, and each step's top-2 margin."""
    with torch.no_grad():
        tokens = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False)[0, len(prompt):].tolist()
        logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    top2 = logits.topk(2, dim=-1).values
    return tokens, logits[0], (top2[:, 0] - top2[:, 1]).tolist()


def first_near_tie(margins, bound):
    """The first step whose two best logits are within `bound`: where greedy tokens may part."""
    return next((i for i, m in enumerate(margins) if m <= bound), len(margins))


def test_the_suite_default_device_is_the_cpu_and_is_read_from_the_environment(tiny_llama, monkeypatch):
    engine = Engine(tiny_llama[1], num_blocks=16)
    assert engine.device.type == "cpu" and engine.dtype == torch.float32
    if not CUDA:
        monkeypatch.setenv("BYZANTIUM_DEVICE", "cuda")
        with pytest.raises(ValueError, match="no CUDA device"):
            Engine(tiny_llama[1], num_blocks=16)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("arch", ["llama", "qwen3-moe", "gemma3", "mistral3"])
def test_cuda_matches_transformers_within_the_dtype_bound(tmp_path, arch, dtype):
    hf = build(arch).eval()
    hf.save_pretrained(tmp_path)
    engine = Engine(tmp_path, device="cuda", dtype=dtype, num_blocks=128)
    prompts = random_prompts([3, 11, 40], seed=5)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    ours = engine.logits(prompts).float().cpu()
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        tokens, logits, margins = reference(hf, prompt, NEW_TOKENS)
        bound = RELATIVE_BOUND[dtype] * float(logits.abs().max())
        drift = float((ours[i] - logits).abs().max())
        assert drift <= bound, f"{arch} {dtype} prompt {i}: logits {drift:.3g} apart, bound {bound:.3g}"
        agree = first_near_tie(margins, bound)
        assert out.token_ids[:agree] == tokens[:agree], (
            f"{arch} {dtype} prompt {i}: tokens part before the first near tie (step {agree})")
