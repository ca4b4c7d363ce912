"""MATH answers by math-verify: what it settles for us, each rule of ours kept where it judges otherwise
(math_equal.py says why), and the guards that keep an adversarial answer from hanging a run on any
thread."""
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from byzantium.tasks import is_correct, normalize_answer
from byzantium.tasks.answers.time_limit import timed


def _same(a, b):
    return is_correct(a, b, "math") and is_correct(b, a, "math")


# ------------------------------------------------------------------ what math-verify settles

@pytest.mark.parametrize("a, b", [
    (r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2"), (r"\dfrac{1}{2}", "0.5"), (r"$\frac{1}{2}$", "1/2"), (r"2\sqrt{2}", r"\sqrt{8}"),
    (r"\sin^2 x + \cos^2 x", "1"), ("x^2-1", "(x-1)(x+1)"), (r"\frac{x+1}{2}", r"\frac{1}{2}x + \frac12"),
    (r"\pi/2", r"\frac{\pi}{2}"), (r"6 - 5i", "-5i+6"), ("y = 2x + 1", "y = 1 + 2x"),
    (r"\begin{bmatrix} -\frac13 \\ 2/3 \end{bmatrix}", r"\begin{pmatrix} -1/3 \\ 2/3 \end{pmatrix}"),
    (r"\left[ \frac{\pi^2}{8}, \frac{5 \pi^2}{4} \right]", r"[\pi^2/8, 5\pi^2/4]"),
    (r"1\frac{4}{5}", "9/5"),  # a mixed number (it was read as 14/5)
    (r"11,\! 111,\! 111,\! 100", "11111111100"),  # a MATH-500 gold: thousands separators, one with a space
])
def test_equivalent_forms(a, b):
    assert _same(a, b)


@pytest.mark.parametrize("a, b", [
    (r"\frac{\sqrt{3}}{2}", r"\sqrt{3}"), ("x^2+1", "(x-1)(x+1)"), ("x + 1", "y + 1"), (r"\pi", "3.14"),
    (r"\begin{pmatrix} 1 & 2 \end{pmatrix}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"), (r"1\frac{4}{5}", "14/5"),
])
def test_different_forms(a, b):
    assert not is_correct(a, b, "math") and not is_correct(b, a, "math")


@pytest.mark.parametrize("forms", [
    [r"\frac{1}{2}", r"\dfrac12", "1/2", "0.5", r"$\frac{1}{2}$", r"\frac{1}{2} \text{ cm}", ".5"],
    [r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2", r"\frac{1}{2}\sqrt{3}"],
    ["x^2 - 1", "(x-1)(x+1)", "-1 + x^2"],
    [r"\text{Evelyn}", "evelyn", r"\text{ Evelyn }"],
    ["3, -1", r"\{-1, 3\}", "x = 3 \\text{ or } x = -1"],
])
def test_equivalent_answers_vote_together(forms):
    """Votes are grouped by normalize_answer: every spelling of one answer gets one canonical string."""
    assert len({normalize_answer(f, "math") for f in forms}) == 1, [normalize_answer(f, "math") for f in forms]


# ------------------------------------------------------------------ our rules, where math-verify differs

@pytest.mark.parametrize("a, b", [
    ("1, 1, 2", "1, 2, 2"),  # repeated roots: a multiset (math-verify's sets merge repeats)
    ("(1,2)", "1, 2"),  # a point is not a list (math-verify: an open interval equals a two-item set)
    ("(2,1)", "(3,1)"),  # points in order (math-verify: two empty intervals, equal)
    ("0.1234567", "0.1234568"),  # two decimals exactly (math-verify rounds to 6 places)
    ("204_5", "204"), ("204_{6}", "204_5"),  # another base (math-verify drops the subscript)
    (r"2\text{ k}", "2"), ("3 million", "3"), ("2k", "2"),  # the unit whitelist (math-verify drops k, million)
    ("x", "X"),  # case counts in maths (math-verify lowercases symbols)
])
def test_rules_kept_where_math_verify_differs(a, b):
    assert not is_correct(a, b, "math") and not is_correct(b, a, "math")
    assert normalize_answer(a, "math") != normalize_answer(b, "math")


@pytest.mark.parametrize("a, b", [
    ("(c)", r"\text{(C)}"),  # an option label (math-verify has none)
    ("5 cm", "5"), (r"864 \mbox{ inches}^2", "864"), ("12 dollars", "12"),  # whitelisted units
    ("204_{5}", "204_5"),
])
def test_rules_kept_accept(a, b):
    assert _same(a, b) and normalize_answer(a, "math") == normalize_answer(b, "math")


def test_ciar_rounding_is_ours():
    # People wrote CIAR's accepted lists with rounded decimals; math-verify has no such rule.
    assert is_correct("0.6667", ["0.67"], "math") and not is_correct("0.6", ["0.67"], "math")


# ------------------------------------------------------------------ adversarial answers never hang

PATHOLOGICAL = [r"10^{10^{10}}", r"(10^{10})!", "9!!!", r"2^{2^{2^{2^{2^{2}}}}}", "(x+1)^{5000}", "2^2^2^2^2^2",
                "10**10**10", r"x^{123456}", "9" * 60, r"\frac{" * 200 + "1" + "}" * 200]


def _judge_all():
    start = time.monotonic()
    for a in PATHOLOGICAL:
        assert not is_correct(a, "1", "math")
        assert is_correct(a, a, "math")  # its own spelling still matches
        normalize_answer(a, "math")
    return time.monotonic() - start


def test_pathological_answers_on_the_main_thread():
    assert _judge_all() < 20


def test_pathological_answers_on_worker_threads():
    with ThreadPoolExecutor(2) as pool:
        assert all(t < 20 for t in pool.map(lambda _: _judge_all(), range(2)))


def test_pathological_answers_in_asyncio_tasks():
    async def main():
        return await asyncio.gather(asyncio.to_thread(_judge_all), asyncio.to_thread(_judge_all))
    assert all(t < 20 for t in asyncio.run(main()))


def test_time_limit_is_not_swallowed_by_a_catch_all():
    def stubborn():  # as sympy and math-verify do: `except Exception` around each step
        while True:
            try:
                sum(range(10_000))
            except Exception:
                pass
    start = time.monotonic()
    assert timed(stubborn, 0.2) is None
    assert time.monotonic() - start < 5


def test_a_parse_cut_short_is_not_remembered(monkeypatch):
    from byzantium.tasks.answers import latex
    answer = r"\frac{7}{13} + \sqrt{17}"  # parsed nowhere else in these tests
    monkeypatch.setattr(latex, "SYMPY_SECONDS", 1e-6)
    assert latex.parse_math(answer) is None  # over the limit (as on a loaded machine)
    monkeypatch.setattr(latex, "SYMPY_SECONDS", 2.0)
    assert latex.parse_math(answer) is not None
