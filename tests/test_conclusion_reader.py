"""The one conclusion reader (tasks/answers/conclusion.py): the forms issue 43 names, each kind through the
same rules, and untrusted text that must neither raise nor take long."""
import pytest

from byzantium.protocols.cpwbft import find_confidence, parse_confidence
from byzantium.protocols.sac import parse_score
from byzantium.tasks import Task
from byzantium.tasks.answers import AMBIGUOUS, READ, UNREAD, read_answer, read_confidence, read_score
from byzantium.tasks.answers.conclusion import strip_think

OPTIONS = ["1250 m", "1300 m", "1350 m", "1400 m"]


@pytest.mark.parametrize("text, kind, want", [
    # a refuted option is not the answer, in every kind
    ("(C) cannot be right, since it ignores the tax. The correct choice is B.", "choice", "B"),
    ("The answer is not 1250; it is 1300.", "number", "1300"),
    ("The answer is not yes.", "bool", "no"),
    ("The hypothesis is entailed by the premise.", "bool", "yes"),
    ("It does not follow from the premise.", "bool", "no"),
    ("I'd pick B rather than C.", "choice", "B"),
    ("B, not C.", "choice", "B"),
    # markers as models write them
    ("Answer - C", "choice", "C"),
    ("Answer: [C]", "choice", "C"),
    (r"\textbf{C}", "choice", "C"),
    ("I'd go with C.", "choice", "C"),
    ("**Final answer:** (D)", "choice", "D"),
    ("## Answer\n\nB", "choice", "B"),
    ("Answer: 1350 m", "choice", "C"),  # an option named by its value
    ("The answer is \u22125.", "number", "-5"),  # a Unicode minus
    ("The answer is \uff11\uff12.", "number", "12"),  # full-width digits
    # the last commitment wins: a later correction beats an earlier box
    (r"So \boxed{12}. Wait, I dropped a term: the answer is 14.", "number", "14"),
    (r"The answer is $\frac{1}{2}$.", "math", r"\frac{1}{2}"),
    ("Verdict: Assistant 1", "verdict", "win"),
    ("Assistant 1 is worse than Assistant 2.", "verdict", "lose"),
    ("The final verdict is Assistant 2 rather than a tie.", "verdict", "lose"),
])
def test_the_committed_answer_is_read(text, kind, want):
    got = read_answer(text, kind, OPTIONS if kind == "choice" else None)
    assert got.status == READ and got.value == want, got


@pytest.mark.parametrize("text, kind", [
    ("The answer is (C) or (D).", "choice"),
    ("The answer is either 12 or 14.", "number"),
    ("Answer: B. On reflection it could just as well be C: B or C, I cannot decide.", "choice"),
    ("It's either yes or no; I can't rule out either.", "bool"),
])
def test_two_answers_at_the_end_are_ambiguous(text, kind):
    got = read_answer(text, kind, OPTIONS if kind == "choice" else None)
    assert got.status == AMBIGUOUS and got.value is None


@pytest.mark.parametrize("text, kind", [
    ("(A) and (D) are both plausible.", "choice"),  # letters of the working are not guessed at
    ("First 3 * 4 = 12, then we add", "number"),  # cut off mid-working
    (r"cut off \boxed{\frac{1}{2", "math"),
    ("Let me think about this more carefully.", "bool"),
    ("", "number"),
])
def test_no_commitment_reads_nothing(text, kind):
    assert read_answer(text, kind, OPTIONS if kind == "choice" else None).status == UNREAD


@pytest.mark.parametrize("text, want", [
    ("Score: 0.8", 0.8), ("a score of 0.8", 0.8), ("I rate it 0.7.", 0.7), ("Score: 7/10", 0.7), ("85%", 0.85),
    ("__Score__: 0.3", 0.3), ("Score (0-1): [0.6]", 0.6), ("Score: 0.9. On reflection, a score of 0.4.", 0.4),
])
def test_judge_scores(text, want):
    assert read_score(text).value == pytest.approx(want) and parse_score(text) == (pytest.approx(want), True)


@pytest.mark.parametrize("text", ["I would rate it 7 out of", "The answer 12 is wrong, I think", "Score:"])
def test_a_judge_without_a_score_scores_half_and_says_so(text):
    assert read_score(text).status != READ and parse_score(text) == (0.5, False)


@pytest.mark.parametrize("text, want", [
    ("Confidence: 0.9", 0.9), ("Confidence score: 0.9", 0.9), ("Confidence level: 0.8", 0.8),
    ("I am 90% confident.", 0.9), ("Answer: 42\nConfidence: 85", 0.85), ("I am not 45% confident; more like 30%.", 0.3),
])
def test_cpwbft_confidences(text, want):
    assert find_confidence(text) == pytest.approx(want)


def test_a_reply_that_is_only_its_answer_has_no_confidence():
    assert find_confidence("42") is None and parse_confidence("42") == 0.0 and read_confidence("42").status == UNREAD


def test_a_gold_that_names_alternatives_accepts_a_reply_naming_them():
    task = Task("t", "q", None, "6 or 12", "math", {"accepted": ["6 or 12"]})
    assert task.check("So the answer is 6 or 12.")
    assert not Task("u", "q", None, "6", "math").check("So the answer is 6 or 12.")


HOSTILE = {
    "markers": "The answer is " * 2000, "boxes": "\\boxed{" * 3000, "think": "<think>" * 3000,
    "digits": "1" * 20000, "either": "either A or B " * 1000, "percent": "5% " * 3000, "bold": "**" * 5000,
    "surrogate": "Answer: \ud800", "display": "$$ \\[ " * 2000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_untrusted_text_is_read_without_raising(name):
    text = HOSTILE[name]
    for kind in ("choice", "number", "math", "bool", "verdict", "text", "code", "translation"):
        assert read_answer(text, kind, OPTIONS if kind == "choice" else None).status in (READ, UNREAD, AMBIGUOUS)
    assert read_score(text).status in (READ, UNREAD, AMBIGUOUS)
    assert read_confidence(text).status in (READ, UNREAD, AMBIGUOUS)


def test_think_blocks_are_dropped_and_an_unclosed_one_runs_to_the_end():
    assert strip_think("a<think>x</think>b<think>y</think>c") == "abc"
    assert strip_think("a<think>never closed") == "a"
    assert read_answer("<think>The answer is 3.</think>The answer is 4.", "number").value == "4"
