"""Sliding-window (Gemma 3) and chunked (Llama 4) models on the compiled CPU kernels, against the torch backend.

"auto" gives these models the CPU kernels (they start each query's keys at its window's or chunk's first
one). Tiny random models, prompts and generations several windows and chunks long, so the masks act in
the prompts' tiles, in decode and in appends: whole prompts, chunked prefill next to decode rows, and
prompts that extend cached ones (a prefix-cache hit, then a short or a long append over it). The tokens
are the torch backend's exactly and the logits within the parity tests' fp32 tolerance.
"""
import pytest
import torch

import test_gemma3
import test_llama4
from byzantium import Engine, SamplingParams
from byzantium.kernels import cpu, cpu_ext
from conftest import random_prompts

pytestmark = pytest.mark.skipif(cpu_ext.load() is None, reason="the compiled CPU kernels are not available here")

LENGTHS = [5, 30, 70, 130]  # past every window and chunk; 130: a prompt of several tiles and key chunks
NEW_TOKENS = 24
TOL = dict(atol=1e-4, rtol=1e-4)  # as test_gemma3.py and test_llama4.py hold the engine to transformers
# name -> (the parity test's builder, its variant, config changes, (window, chunk) of the masked layers)
MODELS = {
    "gemma3-window8": (test_gemma3.build, "window8", {}, (8, None)),
    "gemma3-window40": (test_gemma3.build, "window8", dict(sliding_window=40), (40, None)),  # > a tile's rows
    "llama4-chunk8": (test_llama4.build, "text", {}, (None, 8)),
    "llama4-chunk24": (test_llama4.build, "text", dict(attention_chunk_size=24), (None, 24)),  # across blocks
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> the saved checkpoint directory."""
    out = {}
    for name, (build, variant, changes, _) in MODELS.items():
        out[name] = tmp_path_factory.mktemp(name)
        build(variant, **changes).save_pretrained(out[name])
    return out


def engines(path, **options):
    """(the default engine, the torch-backend engine) of one checkpoint, fp32."""
    common = dict(device="cpu", dtype="float32", num_blocks=96, **options)
    return Engine(path, **common), Engine(path, attention_backend="torch", **common)


class MaskSpy:
    """The compiled kernels, with the masks of every attention call recorded."""

    def __init__(self, ext):
        self.ext, self.masks = ext, set()

    def __getattr__(self, name):
        kernel = getattr(self.ext, name)
        if not name.startswith("paged_"):
            return kernel

        def recorded(*args, **masks):
            self.masks.add((name, masks.get("window", 0), masks.get("chunk", 0)))
            return kernel(*args, **masks)
        return recorded


def assert_same_outputs(got, want):
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for a, b in zip(got, want):
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.keys() == y.keys() and all(abs(x[t] - y[t]) < TOL["atol"] for t in x)


@pytest.mark.parametrize("name", MODELS)
def test_auto_runs_the_cpu_kernels_with_the_masks_and_matches_the_torch_backend(saved, name, monkeypatch):
    kernels, torch_backend = engines(saved[name])
    d = kernels.describe()
    assert (d["attention_backend"], d["attention_backend_reason"]) == ("cpu", "auto: the compiled CPU kernels")
    assert kernels.runner.ops is cpu and torch_backend.describe()["attention_backend"] == "torch"
    spy = MaskSpy(cpu_ext.load())
    monkeypatch.setattr(cpu_ext, "load", lambda: spy)
    prompts = random_prompts(LENGTHS, seed=len(name))
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=1)
    got = kernels.generate(prompts, params)
    assert_same_outputs(got, torch_backend.generate(prompts, params))
    assert len({t for o in got for t in o.token_ids}) > 10  # not one repeated token
    window, chunk = MODELS[name][3]
    masked = {(kernel, window or 0, chunk or 0) for kernel in ("paged_decode_attention", "paged_prefill_attention")}
    assert masked <= spy.masks  # the masked layers ran on the kernels, decode and prefill alike
    # Next-token logits after each prompt, which the prefix cache now holds but for the last token.
    before = kernels.stats["cached_tokens"]
    torch.testing.assert_close(kernels.logits(prompts), torch_backend.logits(prompts), **TOL)
    assert kernels.stats["cached_tokens"] > before


@pytest.mark.parametrize("name", ["gemma3-window8", "llama4-chunk24"])
def test_chunked_prefill_next_to_decode_rows_matches(saved, name):
    # 16-token steps: prompt chunks attend to a cached part longer than the window or chunk, beside decode rows.
    kernels, torch_backend = engines(saved[name], max_batch_tokens=16, max_num_seqs=4)
    prompts = random_prompts(LENGTHS, seed=3)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=1)
    assert_same_outputs(kernels.generate(prompts, params), torch_backend.generate(prompts, params))
    assert any(r.phase == "mixed" for r in kernels.step_records.records)


@pytest.mark.parametrize("name", ["gemma3-window40", "llama4-chunk8"])
def test_appends_over_a_cached_prefix_match(saved, name):
    """Each conversation extended by 3 tokens (row by row on the decode kernel) or 50 (the prefill tiles):
    the prefix cache serves the earlier prompt and reply, the new tokens attend over them."""
    kernels, torch_backend = engines(saved[name])
    prompts = random_prompts(LENGTHS, seed=4)
    params = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=1)
    first = kernels.generate(prompts, params)
    assert_same_outputs(first, torch_backend.generate(prompts, params))
    extra = random_prompts([3, 50, 3, 50], seed=5)
    longer = [p + o.token_ids + e for p, o, e in zip(prompts, first, extra)]
    before = kernels.stats["cached_tokens"]
    assert_same_outputs(kernels.generate(longer, params), torch_backend.generate(longer, params))
    assert kernels.stats["cached_tokens"] - before >= 16 * 8  # whole blocks of every earlier conversation
