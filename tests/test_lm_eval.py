"""lm-evaluation-harness (from the package index) on the engine: a multiple-choice task on a JSONL this
test writes, through `--model byzantium` and through lm-eval's own `hf` model on the same fp32 weights
(a tiny random Llama with a byte-level tokenizer trained here): the same per-choice log-likelihoods and
accuracy; a generate_until task gives the same greedy answers."""
import json

import pytest

lm_eval = pytest.importorskip("lm_eval")
tokenizers = pytest.importorskip("tokenizers")

QUESTIONS = [("The sky is", ["blue", "green", "loud"], 0), ("Two plus two is", ["three", "four", "five"], 1),
             ("Cats say", ["woof", "moo", "meow"], 2), ("Ice is", ["cold", "hot", "sour"], 0)]


@pytest.fixture(scope="module", autouse=True)
def offline():
    """No network, for this module only (other tests check what happens offline and online): lm-eval and
    datasets must not try the hub for a task read from local files. datasets and huggingface_hub read
    these variables once, at import, so their constants are set too."""
    import datasets
    import huggingface_hub
    with pytest.MonkeyPatch.context() as mp:
        for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
            mp.setenv(name, "1")
        mp.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="module")
def tiny_with_tokenizer(tmp_path_factory):
    """A tiny random Llama (fp32) saved with a byte-level BPE tokenizer that fits its 256-token vocabulary."""
    from conftest import build_tiny
    from transformers import PreTrainedTokenizerFast
    path = tmp_path_factory.mktemp("tiny_lm_eval")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=256, special_tokens=["<s>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([q + " " + " ".join(c) for q, c, _ in QUESTIONS], trainer)
    PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="<s>").save_pretrained(path)
    build_tiny("llama", vocab_size=bpe.get_vocab_size()).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    data = root / "questions.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "label": a}) + "\n" for q, c, a in QUESTIONS))
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (root / "mc.yaml").write_text(
        "task: tiny_mc\n" + common + "output_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n")
    (root / "gen.yaml").write_text(
        "task: tiny_gen\n" + common + "output_type: generate_until\ndoc_to_text: '{{question}}'\n"
        "doc_to_target: '{{choices[label]}}'\ngeneration_kwargs:\n  until: ['.']\n  max_gen_toks: 8\n"
        "  do_sample: false\nmetric_list:\n  - metric: exact_match\n")
    from lm_eval.tasks import TaskManager
    return TaskManager(include_path=str(root))


def evaluate(model, model_args, task_manager, task):
    import lm_eval.models  # noqa: F401 - registers hf
    import byzantium.eval.lm_eval_model  # noqa: F401 - registers "byzantium"
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task], task_manager=task_manager,
                                   log_samples=True, batch_size=4, device="cpu")


def per_choice(result, task):
    return [[float(r[0][0]) for r in s["resps"]] for s in result["samples"][task]]


def assert_same_choices(result, hf):
    """Every choice's log-likelihood within 1e-4 of lm-eval's hf model, and the same accuracy."""
    a, b = per_choice(result, "tiny_mc"), per_choice(hf, "tiny_mc")
    assert len(a) == len(QUESTIONS)
    for x, y in zip(a, b):
        assert x == pytest.approx(y, abs=1e-4)
    assert result["results"]["tiny_mc"]["acc,none"] == hf["results"]["tiny_mc"]["acc,none"]


def test_multiple_choice_matches_hf(tiny_with_tokenizer, tasks):
    ours = evaluate("byzantium", f"pretrained={tiny_with_tokenizer},dtype=float32", tasks, "tiny_mc")
    assert_same_choices(ours, evaluate("hf", f"pretrained={tiny_with_tokenizer},dtype=float32", tasks, "tiny_mc"))


def test_generate_until_matches_hf_greedy(tiny_with_tokenizer, tasks):
    ours = evaluate("byzantium", f"pretrained={tiny_with_tokenizer},dtype=float32", tasks, "tiny_gen")
    hf = evaluate("hf", f"pretrained={tiny_with_tokenizer},dtype=float32", tasks, "tiny_gen")
    answers = lambda r: [s["filtered_resps"][0] for s in r["samples"]["tiny_gen"]]  # noqa: E731
    assert answers(ours) == answers(hf)


def test_local_completions_against_our_server_matches_hf(tiny_with_tokenizer, tasks):
    """lm-eval's `local-completions` (echo + logprobs, as it asks vLLM) against our server on the same fp32
    weights: the same per-choice log-likelihoods and accuracy as lm-eval's `hf` model."""
    from byzantium.backends import load_llm
    from byzantium.server.app import ServerThread, build_app
    llm = load_llm(str(tiny_with_tokenizer), device="cpu", dtype="float32", num_blocks=64)
    with ServerThread(build_app({"tiny": llm})) as url:
        served = evaluate("local-completions", f"model=tiny,base_url={url}/v1/completions,tokenizer={tiny_with_tokenizer},"
                          "tokenizer_backend=huggingface,num_concurrent=1,max_retries=1,tokenized_requests=True",
                          tasks, "tiny_mc")
    assert_same_choices(served, evaluate("hf", f"pretrained={tiny_with_tokenizer},dtype=float32", tasks, "tiny_mc"))
