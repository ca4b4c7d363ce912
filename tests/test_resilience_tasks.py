"""The resilience study's tasks: loaders in the original formats (hand-written records here, the
real files when ../shared/data is present), built-in gen-code, and scoring of each kind."""
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from byzantium.tasks import extract_answer, is_correct, load_resilience_task, load_task, normalize_answer
from byzantium.tasks.resilience import (BUILTIN_TASKS, DATA_FILES, RESILIENCE_TASKS, aggregate, gen_code,
                                        load_faireval, score_output)

DATA = Path(__file__).parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "ciar.jsonl").exists(), reason="benchmark data directory not present")

ORIGINAL = {  # hand-written records in each original format
    "humaneval": [{"task_id": "Mine/0",
                   "prompt": 'def inc(x: int) -> int:\n    """ Return x + 1.\n    >>> inc(1)\n    2\n    """\n',
                   "entry_point": "inc", "canonical_solution": "    return x + 1\n",
                   "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n"
                           "    assert candidate(1) == 2\n    assert candidate(-5) == -4\n"}],
    "ciar": [{"question": "A shop halves a price and then raises it by half. What fraction of the old price is it?",
              "answer": ["0.75", "75%", "3/4"], "explanation": "1/2 * 3/2", "incorrect answer": ["1", "100%"],
              "incorrect explanation": "halving and raising cancel", "src_idx": 7},
             {"question": "What is 2/3 as a decimal?", "answer": ["0.67", "2/3"], "explanation": "",
              "incorrect answer": ["0.6"], "incorrect explanation": "", "src_idx": 9}],
    "commonmt": [{"chinese_source": "我今天很高兴。", "english_target_correct": "I am very happy today.",
                  "english_target_wrong": "I am very tall today."},
                 {"chinese_source": "他去商店了。", "english_target_correct": "He went to the store.",
                  "english_target_wrong": "He went to the business."}],
    "faireval": [{"question_id": i + 1, "question": f"Question {i}?", "category": "generic",
                  "response": {"gpt35": f"gpt answer {i}", "vicuna": f"vicuna answer {i}"}, "human_label": label}
                 for i, label in enumerate(["gpt35", "vicuna", "tie"])],
}


def _load(tmp_path, name):
    return load_resilience_task(name, _write(tmp_path, name, ORIGINAL[name]))


def _write(tmp_path, name, records, as_array=False, gz=False):
    path = tmp_path / DATA_FILES[name]
    text = json.dumps(records) if as_array else "".join(json.dumps(r) + "\n" for r in records)
    if gz or path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


# -------------------------------------------------------------------------------------- loading

@pytest.mark.parametrize("name", RESILIENCE_TASKS)
@pytest.mark.parametrize("as_array", [False, True])
def test_loaders_on_original_formats(tmp_path, name, as_array):
    path = _write(tmp_path, name, ORIGINAL[name], as_array=as_array)
    tasks = load_resilience_task(name, path)
    kind = {"humaneval": "code", "ciar": "math", "commonmt": "translation", "faireval": "verdict"}[name]
    assert len(tasks) == len(ORIGINAL[name]) and {t.kind for t in tasks} == {kind}
    assert [t.id for t in load_resilience_task(name, tmp_path)] == [t.id for t in tasks]  # a directory works
    assert [t.id for t in load_task(str(path))] == [t.id for t in tasks]  # and the format is detected
    assert len({t.id for t in tasks}) == len(tasks)


def test_fields_of_each_format(tmp_path):
    he = load_resilience_task("humaneval", _write(tmp_path, "humaneval", ORIGINAL["humaneval"]))[0]
    assert he.id == "Mine/0" and he.gold == "    return x + 1\n" and "def inc(x: int)" in he.question
    assert he.metadata["entry_point"] == "inc" and "check(candidate)" in he.metadata["test"]
    ciar = load_resilience_task("ciar", _write(tmp_path, "ciar", ORIGINAL["ciar"]))
    assert ciar[0].id == "ciar-7" and ciar[0].gold == "0.75"
    assert ciar[0].metadata["accepted"] == ["0.75", "75%", "3/4"]
    assert ciar[0].metadata["incorrect answer"] == ["1", "100%"]
    mt = load_resilience_task("commonmt", _write(tmp_path, "commonmt", ORIGINAL["commonmt"]))[0]
    assert "我今天很高兴。" in mt.question and mt.gold == "I am very happy today."
    assert mt.metadata["wrong"] == "I am very tall today."
    fe = load_resilience_task("faireval", _write(tmp_path, "faireval", ORIGINAL["faireval"]))
    assert [t.gold for t in fe] == ["win", "lose", "tie"]
    q = fe[0].question
    assert q.index("gpt answer 0") < q.index("Assistant 2") < q.index("vicuna answer 0")
    swapped = load_faireval(tmp_path / DATA_FILES["faireval"], first="vicuna")
    assert [t.gold for t in swapped] == ["lose", "win", "tie"] and swapped[0].question.index("vicuna answer 0") < \
        swapped[0].question.index("gpt answer 0")


def test_limit_and_seeded_selection(tmp_path):
    recs = [dict(ORIGINAL["commonmt"][0], chinese_source=f"句子{i}。") for i in range(10)]
    path = _write(tmp_path, "commonmt", recs)
    assert [t.id for t in load_resilience_task("commonmt", path, limit=3)] == ["commonmt-0", "commonmt-1", "commonmt-2"]
    a, b = (load_resilience_task("commonmt", path, limit=4, seed=1) for _ in range(2))
    assert [t.id for t in a] == [t.id for t in b] != [t.id for t in load_resilience_task("commonmt", path, limit=4)]


def test_loader_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown resilience task"):
        load_resilience_task("mmlu", tmp_path)
    with pytest.raises(ValueError, match="needs its data file"):
        load_resilience_task("ciar")
    with pytest.raises(FileNotFoundError, match="ciar.jsonl"):
        load_resilience_task("ciar", tmp_path)
    no_label = [{k: v for k, v in ORIGINAL["faireval"][0].items() if k != "human_label"}]
    with pytest.raises(ValueError, match="human_label"):
        load_resilience_task("faireval", _write(tmp_path, "faireval", no_label))
    with pytest.raises(ValueError, match="not in ciar format"):
        load_resilience_task("ciar", _write(tmp_path, "ciar", [{"question": "q", "answer": [],
                                                                "incorrect answer": []}]))


@needs_data
def test_real_files():
    counts = {"humaneval": 164, "ciar": 40, "commonmt": 100, "faireval": 80}
    for name in RESILIENCE_TASKS:
        tasks = load_resilience_task(name, DATA)
        assert len(tasks) == counts[name] and len({t.id for t in tasks}) == len(tasks)
        assert len(load_resilience_task(name, DATA, limit=5, seed=3)) == 5
    assert Counter(t.gold for t in load_resilience_task("faireval", DATA)) == {"win": 41, "lose": 25, "tie": 14}
    assert Counter(t.gold for t in load_faireval(DATA / "faireval.jsonl", first="vicuna")) == {"lose": 41, "win": 25,
                                                                                             "tie": 14}
    for t in load_resilience_task("ciar", DATA):  # every accepted answer is accepted; the known wrong one is not
        for a in t.metadata["accepted"]:
            assert score_output(t, f"So the answer is {a}.")["correct"], (t.id, a)
        assert not score_output(t, f"So the answer is {t.metadata['incorrect answer'][0]}.")["correct"], t.id
    for t in load_resilience_task("commonmt", DATA, limit=10):
        assert score_output(t, t.gold)["detail"]["bleu"] == pytest.approx(100)


@needs_data
def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    tasks = {t.id: t for t in load_resilience_task("humaneval", DATA)}
    for tid in ("HumanEval/0", "HumanEval/10", "HumanEval/32", "HumanEval/38", "HumanEval/163"):
        t = tasks[tid]
        assert score_output(t, t.gold)["correct"], tid
        whole = f"Here you go:\n```python\n{t.metadata['prompt']}{t.gold}```"
        assert score_output(t, whole)["correct"], tid
    t = tasks["HumanEval/0"]
    wrong = score_output(t, "    return False\n")
    assert wrong["correct"] is False and wrong["score"] == 0.0 and wrong["detail"]["status"] == "failed"


# ------------------------------------------------------------------------------------- gen-code

def test_gen_code_is_seeded_and_solvable():
    a, b, c = gen_code(12, seed=3), gen_code(12, seed=3), gen_code(12, seed=4)
    assert [t.question for t in a] == [t.question for t in b] != [t.question for t in c]
    assert [t.question for t in gen_code(4, seed=3)] == [t.question for t in a[:4]]
    assert len({t.id for t in a}) == 12 and {t.kind for t in a} == {"code"}
    assert [t.id for t in load_task("gen-code", limit=12, seed=3)] == [t.id for t in a]
    assert [t.id for t in load_resilience_task("gen-code", limit=12, seed=3)] == [t.id for t in a]
    for t in a:
        assert t.metadata["prompt"] in t.question.replace("```python\n", "") + "\n"
        assert score_output(t, t.gold)["correct"], t.id
        assert not score_output(t, "    return None\n")["correct"], t.id
    assert "gen-arith" in BUILTIN_TASKS and len(load_resilience_task("gen-arith", limit=3)) == 3


# -------------------------------------------------------------------------------------- scoring

def test_ciar_accepted_answers(tmp_path):
    t, frac = _load(tmp_path, "ciar")
    for text in ("The answer is 3/4.", r"So it is \boxed{75\%}.", "Answer: 0.75", r"$\frac{3}{4}$"):
        assert score_output(t, text) == {"kind": "math", "score": 1.0, "correct": True,
                                         "detail": {"answer": extract_answer(text, "math"), "gold": "0.75"}}
        assert t.check(text)
    for text in ("The answer is 1.", "The answer is 0.5.", "I don't know"):
        assert score_output(t, text)["correct"] is False and not t.check(text)
    # Rounded accepted decimals: a more precise number that rounds to one counts; a coarser one does not.
    assert score_output(frac, "The answer is 0.6667")["correct"]
    assert score_output(frac, "The answer is 2/3")["correct"]
    assert not score_output(frac, "The answer is 0.7")["correct"]
    assert not score_output(frac, "The answer is 0.6")["correct"]
    assert is_correct("0.75", ["0.75", "3/4"], "math") and not is_correct("0.7512", ["0.5"], "math")


def test_translation_scores(tmp_path):
    t = _load(tmp_path, "commonmt")[0]
    same = score_output(t, "I am very happy today.")
    assert same["detail"]["bleu"] == pytest.approx(100) and same["detail"]["chrf"] == pytest.approx(100)
    assert same["score"] == pytest.approx(1.0) and same["correct"] is None
    marked = score_output(t, 'Here is the translation:\n\n"I am very happy today."\n\nThe word 高兴 means happy.')
    assert marked["detail"]["hypothesis"] == "I am very happy today."
    wrong = score_output(t, "I am very tall today.")
    assert 0 < wrong["detail"]["chrf"] < 100 and wrong["detail"]["bleu"] < 100
    assert score_output(t, "")["score"] == 0.0
    both = aggregate([same, same])
    assert both["bleu"] == pytest.approx(100) and both["chrf"] == pytest.approx(100)
    mixed = aggregate([same, wrong])
    assert 0 < mixed["bleu"] < 100 and 0 < mixed["chrf"] < 100 and mixed["n"] == 2 and "accuracy" not in mixed
    with pytest.raises(ValueError, match="BLEU"):
        t.check("I am very happy today.")
    assert normalize_answer("I am happy.", "translation") == "i am happy"


@pytest.mark.parametrize("text,want", [
    ("Assistant 1 is more detailed.\nVerdict: Assistant 1", "win"),
    ("**Final verdict:** Assistant 2", "lose"),
    ("Verdict: tie", "tie"),
    ("Decision: Assistant 2 wins.", "lose"),
    ("Final verdict: both are good, but Assistant 1 is slightly better", "win"),
    ("8 7\nAssistant 1 covers more points.", "win"),  # FairEval's score line
    ("6/10, 9/10\nThe second one is clearer.", "lose"),
    ("7 7\nBoth are fine.", "tie"),
    ("[[B]]", "lose"),
    ("After weighing both: [[C]]", "tie"),
    ("Assistant 2's answer is longer, but Assistant 1 is clearly better overall.", "win"),
    ("Response 2 was the better one in every respect.", "lose"),
    ("They performed equally well, so it is a tie.", "tie"),
    ("Assistant 1", "win"),
    ("tie", "tie"),
    ("Both answers have strengths and weaknesses.", None),
    ("", None),
])
def test_verdict_parsing(text, want):
    assert extract_answer(text, "verdict") == want


def test_faireval_scoring_and_aggregate(tmp_path):
    win, lose, tie = _load(tmp_path, "faireval")
    assert score_output(win, "Verdict: Assistant 1")["correct"]
    assert not score_output(win, "Verdict: Assistant 2")["correct"]
    assert score_output(lose, "[[B]]")["correct"] and score_output(tie, "Verdict: tie")["correct"]
    unparsed = score_output(tie, "No idea.")
    assert unparsed["correct"] is False and unparsed["detail"]["answer"] is None
    assert normalize_answer("Assistant 2", "verdict") == "lose" and is_correct("WIN", "win", "verdict")
    agg = aggregate([score_output(win, "Verdict: Assistant 1"), unparsed])
    assert agg == {"n": 2, "score": 0.5, "accuracy": 0.5}
    json.dumps(unparsed)  # results go to JSONL as they are


def test_code_score_is_json_and_records_the_status(tmp_path):
    t = _load(tmp_path, "humaneval")[0]
    ok = score_output(t, "```python\ndef inc(x):\n    return x + 1\n```")
    assert ok["correct"] and ok["detail"]["status"] == "passed" and json.dumps(ok)
    slow = score_output(t, "    while True:\n        pass\n", timeout_s=1.0)
    assert slow["score"] == 0.0 and slow["detail"]["status"] == "timeout"
    assert aggregate([ok, slow]) == {"n": 2, "score": 0.5, "accuracy": 0.5}
