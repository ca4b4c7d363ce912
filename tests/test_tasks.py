import json
import re
import sys
import time
from pathlib import Path

import pytest

from byzantium.tasks import (TASKS, Task, detect_format, extract_answer, get_task, is_correct, load_hub, load_jsonl,
                             load_task, normalize_answer)

DATA = Path(__file__).parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="benchmark data directory not present")


# ---------------------------------------------------------------------------------- extraction

@pytest.mark.parametrize("text,kind,choices,want", [
    (r"First \boxed{3} then finally \boxed{\frac{1}{\sqrt{2}}}.", "math", None, r"\frac{1}{\sqrt{2}}"),
    (r"So $x = \boxed{\dfrac{a}{\boxed{b}+1}}$", "math", None, r"\dfrac{a}{\boxed{b}+1}"),
    (r"The final answer is $\frac{3}{4}$. I hope it is correct.", "math", None, r"\frac{3}{4}"),
    (r"so we get $y=7$ in the end", "math", None, "y=7"),
    ("<think>maybe \\boxed{1}</think> The answer is 2.", "math", None, "2"),
    (r"cut off \boxed{\frac{1}{2", "math", None, None),  # a box cut off commits to nothing (no last-number guess)
    ("we add 3 and 4 to get 7 apples", "number", None, None),  # working states no conclusion (issue 43: no guessing)
    ("The total is 1,000 dollars.\nAnswer: $1,000", "number", None, "1000"),
    ("It costs $5.00 in total. The answer is $5.00.", "number", None, "5.00"),
    ("48/2 = 24 cookies\n#### 24", "number", None, "24"),
    ("**Answer:** 3 + 4 = 7", "number", None, "7"),
    ("no number here", "number", None, None),
    ("The answer is (c).", "choice", ["x", "y", "z", "w"], "C"),
    ("(B) is what I pick", "choice", None, "B"),
    ("B. because the others fail", "choice", None, "B"),
    ("A) first\nAfter thinking:\nC) is right", "choice", None, "C"),
    ("Answer: a marsh", "choice", ["a marsh", "a tundra", "the plains", "a desert"], "A"),
    ("the answer is C", "choice", None, "C"),
    (r"\boxed{\text{(D)}}", "choice", None, "D"),
    ("I am not sure.", "choice", ["p", "q"], None),
    ("Yes, because the passage says so, although it is not true of all.", "bool", None, "yes"),
    ("Considering everything, the answer is: False.", "bool", None, "no"),
    ("It does not follow. Answer: not_entailment", "bool", None, "no"),
    ("Here:\n```python\ndef f():\n    return 1\n```", "code", None, "def f():\n    return 1"),
])
def test_extract(text, kind, choices, want):
    assert extract_answer(text, kind, choices) == want


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError):
        extract_answer("1", "float")


# ------------------------------------------------------------------------------- normalisation

def test_equivalent_spellings_group_together():
    same = ["1/2", r"\frac{1}{2}", "0.5", r"\dfrac12", r"\tfrac{1}{2}", "0.50", r"$\frac{1}{2}$", ".5"]
    assert len({normalize_answer(a, "math") for a in same}) == 1
    assert normalize_answer("1,000", "number") == normalize_answer("1000.0", "number") == "1000"
    assert normalize_answer(r"\frac{\sqrt{2}}{2}", "math") == normalize_answer(r"\frac{1}{\sqrt2}", "math")
    assert normalize_answer("2(x+1)", "math") == normalize_answer("2x+2", "math")
    assert normalize_answer("(b)", "choice") == normalize_answer("B.", "choice") == "B"
    assert normalize_answer("True", "bool") == "yes" and normalize_answer("entailment", "bool") == "yes"
    assert normalize_answer(None, "math") is None


@pytest.mark.parametrize("pred,gold", [
    ("1,000", "1000"), (r"\$5.00", "5"), ("5.0", "5"), (r"10\%", "10"), (r"90^\circ", "90"),
    (r"5\text{ cm}", "5"), ("x = 5", "5"), (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})"),
    ("(x+1)^2", "x^2+2x+1"), (r"\frac{\cos x}{\sin x}", r"\cot x"), ("0.3333333", r"\frac13"),
    (r"\text{(C)}", "C"), (r"\text{Evelyn}", "Evelyn"), ("y = 2x+3", "y=2x+3"), (r"2\sqrt{2}", r"\sqrt{8}"),
    ("6 - 5i", "6-5i"), (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}"),
])
def test_math_equivalent(pred, gold):
    assert is_correct(pred, gold, "math")


@pytest.mark.parametrize("pred,gold", [
    ("3", "4"), (r"\frac{1}{3}", "0.33"), ("(1,2)", "(2,1)"), ("(1,2)", "[1,2]"), ("x+1", "x+2"),
    ("Evelyn", "Navin"), (None, "1"), ("", "1"),
])
def test_math_not_equivalent(pred, gold):
    assert not is_correct(pred, gold, "math")


def test_other_kinds():
    assert is_correct("18.00", "18", "number") and not is_correct("18.5", "18", "number")
    assert is_correct("(c)", "C", "choice") and not is_correct("D", "C", "choice")
    assert is_correct("Yes", "yes", "bool") and not is_correct("no", "yes", "bool")
    assert is_correct("The Eiffel tower!", "eiffel Tower", "text")


def test_pathological_and_hostile_answers_are_safe_and_fast():
    t = time.time()
    assert not is_correct("2^{10^{10^{10}}}", "2", "math")
    assert not is_correct("9" * 5000, "1", "math")
    assert not is_correct("__import__('os').system('echo hi')", "0", "math")
    assert not is_correct(r"\frac{" * 50, "1", "math")
    assert normalize_answer("__class__.__mro__", "math") is not None  # kept as a plain string
    assert time.time() - t < 10


def test_checks_work_off_the_main_thread():
    from concurrent.futures import ThreadPoolExecutor  # the time limit then uses a worker thread
    with ThreadPoolExecutor(2) as pool:
        assert pool.submit(is_correct, "(x+1)^2", "x^2+2x+1", "math").result()
        assert pool.submit(normalize_answer, r"\frac{1}{2}", "math").result() == "0.5"


def test_task_record():
    t = Task("t1", "Which?", ["yes it is", "no"], "B", "choice")
    assert t.prompt() == "Which?\nOptions:\n(A) yes it is\n(B) no"
    assert t.check("The answer is (B).") and not t.check("(A)")
    with pytest.raises(ValueError):
        Task("t2", "q", ["a", "b"], "C", "choice")
    with pytest.raises(ValueError):
        Task("t3", "q", None, "1", "float")


# ---------------------------------------------------------------------------------- generators

@pytest.mark.parametrize("name", sorted(TASKS))
def test_generators_are_seeded(name):
    a, b, c = get_task(name, 12, seed=7), get_task(name, 12, seed=7), get_task(name, 12, seed=8)
    assert [(t.question, t.gold, t.choices) for t in a] == [(t.question, t.gold, t.choices) for t in b]
    assert [t.question for t in a] != [t.question for t in c]
    assert [t.question for t in get_task(name, 5, seed=7)] == [t.question for t in a[:5]]
    assert len({t.id for t in a}) == 12
    for t in a:  # the gold, rendered the usual ways, checks as correct
        shown = f"({t.gold})" if t.kind == "choice" else t.gold
        assert t.check(f"Reasoning...\nThe answer is {shown}.")


def test_gen_arith_answers():
    for t in get_task("gen-arith", 40, seed=1):
        m = re.fullmatch(r"Compute (.*)\.", t.question)
        if m:
            assert int(t.gold) == eval(m.group(1), {"__builtins__": {}})


def test_gen_track_answers_by_simulation():
    for k in (3, 5, 7):
        for t in get_task("gen-track", 15, seed=2, k=k):
            people = re.match(r"(.*?) (?:are|is) ", t.question).group(1).replace(", and", ",").split(", ")
            assert len(people) == k == len(t.choices)
            holds = dict(zip(people, range(k)))
            for a, b in re.findall(r"(\w+) and (\w+) (?:trade|switch|swap)", t.question):
                holds[a], holds[b] = holds[b], holds[a]
            who = re.search(r"At the end of the \w+, (\w+)", t.question).group(1)
            assert t.choices[holds[who]] == t.choices["ABCDEFG".index(t.gold)]


def test_gen_order_is_well_posed():
    for k in (3, 5, 7):
        for t in get_task("gen-order", 10, seed=3, k=k):
            assert len(t.choices) == k and t.gold in t.letters
            assert t.choices["ABCDEFG".index(t.gold)] + "." not in t.question  # answer never given


def test_unknown_task_names():
    with pytest.raises(ValueError, match="unknown"):
        get_task("gen-nope", 3)
    with pytest.raises(ValueError, match="unknown task"):
        load_task("no-such-task")


# ------------------------------------------------------------------------------------- loaders

ORIGINAL = {  # one hand-written record in each original format
    "math500": {"problem": "What is $1+1$?", "solution": "Clearly $1+1=\\boxed{2}$.", "answer": "2",
                "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"},
    "gsm8k": {"question": "Tom has 3 apples and buys 1,200 more. How many?",
              "answer": "3+1200=<<3+1200=1203>>1203\n#### 1,203"},
    "aqua": {"question": "2+2?", "options": ["A)3", "B)4", "C)5", "D)6", "E)7"], "rationale": "2+2=4", "correct": "B"},
    "bbh": {"input": "Which is red?\nOptions:\n(A) sky\n(B) blood", "target": "(B)"},
    "arc": {"id": "Q1", "question": {"stem": "Which is a metal?", "choices": [
        {"text": "wood", "label": "1"}, {"text": "iron", "label": "2"}, {"text": "glass", "label": "3"}]},
        "answerKey": "2"},
    "obqa": {"id": "7-1", "question_stem": "Fog forms near", "choices": {"text": ["a marsh", "a desert"],
             "label": ["A", "B"]}, "answerKey": "A"},
    "boolq": {"question": "is the sky blue", "title": "Sky", "answer": True, "passage": "The sky is blue."},
    "rte": {"premise": "A cat sleeps.", "hypothesis": "An animal sleeps.", "label": "entailment", "idx": 0},
    "hellaswag": {"ind": 4, "activity_label": "Baking", "ctx": "She puts the cake in the oven. She",
                  "endings": ["eats the oven.", "waits for it to bake.", "flies away.", "sings to a chair."],
                  "label": "1"},
}
GOLD = {"math500": "2", "gsm8k": "1203", "aqua": "B", "bbh": "B", "arc": "B", "obqa": "A", "boolq": "yes",
        "rte": "yes", "hellaswag": "B"}


@pytest.mark.parametrize("fmt", sorted(ORIGINAL))
def test_original_formats(tmp_path, fmt):
    path = tmp_path / f"{fmt}.jsonl"
    path.write_text(json.dumps(ORIGINAL[fmt]) + "\n")
    assert detect_format(ORIGINAL[fmt]) == fmt
    for tasks in (load_jsonl(path), load_jsonl(path, format=fmt), load_task(str(path))):
        (t,) = tasks
        assert t.gold == GOLD[fmt] and is_correct(t.gold, t.gold, t.kind)
        assert t.question and "Options:" not in t.question


def test_other_shapes(tmp_path):
    gauntlet = {"query": "Question: Which is a metal?", "choices": ["wood", "iron"], "gold": 1}
    (t,) = [load_jsonl(_write(tmp_path, [gauntlet]))[0]]
    assert (t.question, t.gold) == ("Which is a metal?", "B")
    boolq = {"query": "Passage: p\nQuestion: q?", "choices": ["no", "yes"], "gold": 0}
    assert load_jsonl(_write(tmp_path, [boolq]))[0].gold == "no"
    glue = {"sentence1": "a", "sentence2": "b", "label": 1, "idx": 3}
    assert load_jsonl(_write(tmp_path, [glue]))[0].gold == "no"
    hella = dict(ORIGINAL["hellaswag"], label=3)
    assert load_jsonl(_write(tmp_path, [hella]))[0].gold == "D"
    bbh = tmp_path / "task.json"  # BBH's own file: {"canary": ..., "examples": [...]}
    bbh.write_text(json.dumps({"canary": "x", "examples": [{"input": "not ( True )", "target": "False"}]}))
    t = load_jsonl(bbh)[0]
    assert (t.kind, t.gold) == ("bool", "no")


def test_limit_and_seed(tmp_path):
    path = _write(tmp_path, [dict(ORIGINAL["gsm8k"], src_idx=i) for i in range(20)])
    assert [t.id for t in load_jsonl(path, limit=3)] == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]
    a, b = load_task(str(path), limit=5, seed=1), load_task(str(path), limit=5, seed=1)
    assert [t.id for t in a] == [t.id for t in b] != [t.id for t in load_jsonl(path, limit=5)]


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match="cannot tell"):
        load_jsonl(_write(tmp_path, [{"foo": 1}]))
    with pytest.raises(ValueError, match="record 0"):
        load_jsonl(_write(tmp_path, [{"foo": 1}]), format="aqua")
    with pytest.raises(ValueError, match="no label"):
        load_jsonl(_write(tmp_path, [dict(ORIGINAL["hellaswag"], label="")]))


def test_hub_without_datasets_fails_clearly(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as if not installed
    with pytest.raises(RuntimeError, match="datasets"):
        load_hub("gsm8k")
    with pytest.raises(RuntimeError, match="datasets"):
        load_task("openai/gsm8k")


def _write(tmp_path, records):
    path = tmp_path / f"f{len(list(tmp_path.iterdir()))}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ------------------------------------------------------------------------------ the real files

REAL = {"math500.jsonl": "math500", "gsm8k.jsonl": "gsm8k", "aqua.jsonl": "aqua", "arc_challenge.jsonl": "arc",
        "boolq.jsonl": "boolq", "openbookqa.jsonl": "obqa", "rte.jsonl": "rte",
        "bbh_logical_deduction_three_objects.jsonl": "bbh", "bbh_logical_deduction_seven_objects.jsonl": "bbh",
        "bbh_tracking_shuffled_objects_seven_objects.jsonl": "bbh"}


@needs_data
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_file_loads_and_golds_check(name):
    lines = sum(1 for line in open(DATA / name) if line.strip())
    tasks = load_jsonl(DATA / name)
    assert len(tasks) == lines and tasks[0].metadata["format"] == REAL[name]
    assert len({t.id for t in tasks}) == len(tasks)
    for t in tasks:
        shown = f"({t.gold})" if t.kind == "choice" else t.gold
        assert t.check(f"Let me think.\nThe answer is {shown}.")
        assert is_correct(t.gold, t.gold, t.kind)
        if t.kind == "choice":  # a wrong letter is wrong
            wrong = next(x for x in t.letters if x != t.gold)
            assert not t.check(f"The answer is ({wrong}).")


@needs_data
def test_math500_boxed_solutions_match_answers():
    tasks = load_jsonl(DATA / "math500.jsonl")
    agree = sum(is_correct(extract_answer(t.metadata["solution"], "math"), t.gold, "math") for t in tasks)
    assert agree / len(tasks) >= 0.98, f"{agree}/{len(tasks)}"
    assert all(t.check(t.metadata["solution"]) == is_correct(extract_answer(t.metadata["solution"], "math"),
                                                              t.gold, "math") for t in tasks[:20])


@needs_data
def test_gsm8k_solutions_give_the_final_answer():
    tasks = load_jsonl(DATA / "gsm8k.jsonl")
    assert all(t.check(t.metadata["answer"]) for t in tasks)


def test_a_task_with_several_accepted_answers_accepts_each_of_them():
    from byzantium.protocols.byzantine import wrong_answers
    task = Task("t", "What is 2 divided by 3?", None, "0.67", "math", {"accepted": ["0.67", "2/3"]})
    assert task.accepted == ["0.67", "2/3"]
    assert task.accepts("2/3") and task.accepts("0.67") and not task.accepts("0.5")
    assert task.check("So the answer is \\boxed{2/3}.")
    # An adversary never gets an accepted alternative as its "wrong" answer.
    assert wrong_answers(task, ["2/3", "0.5", "0.67", "3/2"]) == ["0.5", "3/2"]
    plain = Task("u", "What is 1 + 1?", None, "2", "number")
    assert plain.accepted == "2" and plain.accepts("2.0") and not plain.accepts("3")
