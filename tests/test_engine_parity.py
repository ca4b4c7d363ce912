"""The engine against plain transformers: same greedy tokens, same logits."""
import pytest
import torch

from byzantium import Engine, SamplingParams
from conftest import ARCHS, random_prompts

LENGTHS = [3, 9, 16, 17, 31, 40, 52, 60]


def hf_greedy(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_greedy_matches_transformers_one_at_a_time(tiny_models, arch):
    hf, path = tiny_models[arch]
    engine = Engine(path, num_blocks=128)
    prompts = random_prompts(LENGTHS, seed=ARCHS.index(arch))
    outputs = engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == hf_greedy(hf, prompt, 24)
        assert out.finish_reason == "length" and out.num_prompt_tokens == len(prompt)
    assert engine.stats["max_batch_seqs"] == len(prompts)  # really batched


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_logits_match_transformers(tiny_models, arch):
    hf, path = tiny_models[arch]
    engine = Engine(path, num_blocks=128)
    prompts = random_prompts(LENGTHS, seed=10 + ARCHS.index(arch))
    ours = engine.logits(prompts)
    assert engine.stats["steps"] == 1  # all prompts in one forward pass
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            theirs = hf(torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(ours[i], theirs, atol=1e-4, rtol=1e-4)


def test_chunked_prefill_and_tiny_budget_give_same_tokens(tiny_llama):
    hf, path = tiny_llama
    prompts = random_prompts([45, 70, 5], seed=3)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    wide = Engine(path, num_blocks=64).generate(prompts, params)
    narrow_engine = Engine(path, num_blocks=64, max_batch_tokens=16, max_num_seqs=4)
    narrow = narrow_engine.generate(prompts, params)
    assert [o.token_ids for o in wide] == [o.token_ids for o in narrow]
    assert narrow_engine.stats["max_batch_tokens"] <= 16
    assert any(r.phase == "mixed" for r in narrow_engine.step_records.records)  # prefill and decode shared a step


def test_smollm2_chat_matches_transformers(smollm2_dir, smollm2_engine):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    conversations = [[{"role": "user", "content": "What is the capital of France?"}],
                     [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}],
                     [{"role": "user", "content": "2 + 2 = ?"}]]
    outs = smollm2_engine.chat(conversations, SamplingParams(max_tokens=24))
    for conv, out in zip(conversations, outs):
        prompt = smollm2_engine.render_chat(conv)
        assert out.num_prompt_tokens == len(prompt)
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):].tolist()
        assert out.token_ids == expected
        assert out.text and "<|im_end|>" not in out.text
    logits = smollm2_engine.logits([smollm2_engine.render_chat(c) for c in conversations])
    with torch.no_grad():
        for i, conv in enumerate(conversations):
            ref = hf(torch.tensor([smollm2_engine.render_chat(conv)])).logits[0, -1]
            torch.testing.assert_close(logits[i], ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rope_scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "linear", "factor": 2.0}])
def test_scaled_rope_matches_transformers(tmp_path, rope_scaling):
    # Llama 3.x ships llama3 rope scaling: its tables are computed while the model is built on meta.
    from conftest import build_tiny
    hf = build_tiny("llama", rope_scaling=rope_scaling, rope_theta=500000.0)
    hf.save_pretrained(tmp_path)
    engine = Engine(tmp_path, num_blocks=64)
    prompt = random_prompts([90], seed=9)[0]  # past the original 64 positions
    assert engine.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids == hf_greedy(hf, prompt, 12)
