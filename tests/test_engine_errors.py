"""Bad input gives a clear error, never a hang or a silent truncation."""
import time

import pytest

from byzantium import Engine, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine(tiny_llama[1], num_blocks=16)


def test_empty_prompt(engine):
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[]], SamplingParams())


def test_prompt_longer_than_context(engine):
    with pytest.raises(ValueError, match="context is 512"):
        engine.generate([[1] * 600], SamplingParams())


def test_max_tokens_below_one():
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_pool_too_small_for_one_request(engine):
    with pytest.raises(ValueError, match="KV cache pool holds only 256"):
        engine.generate([[1] * 200], SamplingParams(max_tokens=100))


def test_token_ids_out_of_vocabulary(engine):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([[1, 2, 999]], SamplingParams())


def test_unknown_model_fails_fast():
    start = time.perf_counter()
    with pytest.raises(ValueError, match="no-such-model"):
        Engine("no-such-model")
    assert time.perf_counter() - start < 5


def test_bad_engine_arguments(tiny_llama):
    with pytest.raises(ValueError, match="block_size"):
        Engine(tiny_llama[1], block_size=0)
    with pytest.raises(ValueError, match="dtype"):
        Engine(tiny_llama[1], dtype="float13")
    with pytest.raises(ValueError, match="attention_backend"):
        Engine(tiny_llama[1], attention_backend="magic")


def test_unsupported_architecture(tmp_path):
    from transformers import GPT2Config
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="supported: LlamaForCausalLM"):
        Engine(tmp_path)


def test_session_misuse(engine):
    session = engine.open_session([1, 2, 3])
    engine.close_session(session)
    with pytest.raises(ValueError, match="not idle"):
        engine.extend(session, [4])
