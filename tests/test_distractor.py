"""The injection's target for open answers: every task gets one, wrong by the one checker, in its own
shape, in constant memory, the same in every process."""
import re
import time
import tracemalloc
from pathlib import Path

import pytest

from byzantium.protocols.attacks import distractor
from byzantium.tasks import Task, load_task

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

NAMES = ('Which student has the greatest average speed? label("Evelyn", (1, 4)); label("Briana", (2, 2)); '
         'label("Carla", (4, 5)); label("Debra", (5, 2));')
SHAPES = "Find the curve defined by r = 4.\n(A) Line (B) Circle (C) Parabola (D) Ellipse (E) Hyperbola"

# Golds on which the old distractor raised (expressions, complex numbers, tuples, words), first; then
# numbers that are large, grouped, percent, leading-dot, LaTeX fractions with one-digit arguments.
HARD = [
    Task("m-pq", "Write it in terms of p and q.", None, "p - q", "math"),
    Task("m-cx", "Compute z.", None, "6 - 5i", "math"),
    Task("m-5i", "Compute z.", None, "5i", "math"),
    Task("m-tuple", "Find (a,b,c).", None, "(6,31,-1)", "math"),
    Task("m-pair", "Solve.", None, "1,-2", "math"),
    Task("m-cot", "Simplify.", None, "\\cot x", "math"),
    Task("m-pm", "Solve.", None, "1 \\pm \\sqrt{19}", "math"),
    Task("m-poly", "Expand.", None, "x^3+3x-6", "math"),
    Task("m-interval", "Solve.", None, "(3,4]", "math"),
    Task("m-in", "Solve.", None, "x \\in [-2,7]", "math"),
    Task("m-vec", "Project.", None, "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}", "math"),
    Task("m-name", NAMES, None, "\\text{Evelyn}", "math"),
    Task("m-even", 'Is it even, odd, or neither? Enter "odd", "even", or "neither".', None, "\\text{even}", "math"),
    Task("m-letter", SHAPES, None, "\\text{(C)}", "math"),
    Task("m-pi", "Find the area.", None, "\\pi", "math"),
    Task("m-frac", "Simplify.", None, "\\frac65", "math"),
    Task("m-frac2", "Simplify.", None, "\\frac9{19}", "math"),
    Task("t-city", "Name it.", None, "Paris", "text"),
    Task("c-list", "What share?", None, "0.5", "math", {"accepted": ["0.5", "50%", "1/2"]}),
    Task("m-pct", "What share?", None, "48%", "math"),
    Task("m-dot", "Compute.", None, ".35625", "math"),
    Task("n-zero", "How many?", None, "0", "number"),
    Task("n-gsm", "How many?", None, "2880000", "number"),
    Task("m-grouped", "How many?", None, "11,\\! 111,\\! 111,\\! 100", "math"),
    Task("n-huge", "How many?", None, "9" * 60, "number"),
    Task("m-huge", "How many?", None, "1" + "0" * 300, "math"),
]


def test_hard_golds_get_a_wrong_answer_of_the_same_shape():
    for task in HARD:
        for seed in range(3):
            d = distractor(task, seed)
            assert not task.accepts(d), (task.gold, d)
            assert d == distractor(task, seed)
            assert len(d) <= len(task.gold) + 12, (task.gold, d)  # a variant, never something huge
    pick = {t.id: distractor(t, 0) for t in HARD}
    assert pick["m-cx"].endswith("i") and pick["m-5i"].endswith("i")
    assert re.fullmatch(r"\(-?\d+,-?\d+,-?\d+\)", pick["m-tuple"])
    assert pick["m-name"] in {"\\text{Briana}", "\\text{Carla}", "\\text{Debra}"}
    assert pick["m-even"] in {"\\text{odd}", "\\text{neither}"}
    assert re.fullmatch(r"\\text\{\([ABDE]\)\}", pick["m-letter"])
    assert pick["m-pct"].endswith("%") and re.fullmatch(r"\.\d{5}", pick["m-dot"])
    assert re.fullmatch(r"\\frac\{\d\}\{\d\}", pick["m-frac"])  # "\frac65" is 6/5: a digit stays a digit
    assert re.fullmatch(r"\d+0000", pick["n-gsm"])  # a round number stays round
    assert [distractor(t, 0) for t in HARD] != [distractor(t, 1) for t in HARD]  # the seed matters


def test_large_numbers_take_constant_memory():
    # The old distractor listed every integer within |gold|/4: 2,880,000 took seconds and hundreds of MB.
    for task in [t for t in HARD if t.id in ("n-gsm", "m-grouped", "n-huge", "m-huge")]:
        distractor(task)  # warm (imports, regex caches)
        tracemalloc.start()
        try:
            d = distractor(task)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1_000_000, (task.gold, peak)
        assert not task.accepts(d)


def test_other_kinds():
    verdict = Task("v", "Which is better?", None, "tie", "verdict")
    assert distractor(verdict) in ("win", "lose") and not verdict.accepts(distractor(verdict))
    for kind in ("code", "translation"):
        with pytest.raises(ValueError, match=kind):
            distractor(Task("x", "Do it.", None, "return 1", kind))
    with pytest.raises(ValueError, match="one option"):
        distractor(Task("one", "Pick.", ["only"], "A", "choice"))


def test_same_in_every_process():
    """Seeded from the seed and the task id through random.Random(str) (SHA-512, the same in every
    process and Python version; never the salted hash()): known values pin it."""
    picks = {t.id: distractor(t, 7) for t in HARD if t.id in ("m-tuple", "m-name", "m-frac", "n-gsm")}
    assert picks == {"m-tuple": "(6,38,-1)", "m-name": "\\text{Carla}", "m-frac": "\\frac{8}{5}", "n-gsm": "3440000"}


@pytest.mark.parametrize("name", ["math500", "gsm8k", "aqua", "ciar", "boolq", "rte", "faireval", "arc_challenge",
                                  "openbookqa", "bbh_logical_deduction_three_objects",
                                  "bbh_logical_deduction_seven_objects",
                                  "bbh_tracking_shuffled_objects_seven_objects"])
def test_every_task_of_the_shared_data(name):
    path = DATA / f"{name}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present")
    tasks = load_task(str(path))
    start = time.perf_counter()
    for task in tasks:
        d = distractor(task)
        assert not task.accepts(d), (task.id, task.gold, d)
        assert len(d) <= len(str(task.gold)) + 12, (task.id, task.gold, d)
    # A sanity bound only (measured: ~20 us a task, plus the checker's sympy call for symbolic golds).
    assert (time.perf_counter() - start) / len(tasks) < 0.05


@pytest.mark.parametrize("task", [*HARD, Task("n-big", "How many?", None, "2880000", "number")], ids=lambda t: t.id)
def test_an_adversary_without_a_cached_answer_falls_back_to_a_verified_wrong_one(task):
    # the old fallback wrote gold + 1 unchecked ("p - q + 1", "2880001") for SAC/CP-WBFT's fixed adversary
    from byzantium.protocols.byzantine import wrong_answers
    (answer,) = wrong_answers(task, [])
    assert not task.accepts(answer)
