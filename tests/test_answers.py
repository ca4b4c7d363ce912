"""The one answer check: units, letter suffixes, text case, and every gold of ../shared/data against
perturbations of itself (harmless ones accepted, harmful ones rejected)."""
import re
import time
from pathlib import Path

import pytest

from byzantium.protocols.voting import plurality
from byzantium.tasks import Task, extract_answer, is_correct, load_jsonl, load_resilience_task, normalize_answer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


# ------------------------------------------------------------------ fixed cases (always run)

# A letter after a number is a variable or the imaginary unit, not a unit: another value.
@pytest.mark.parametrize("kind", ["number", "math"])
@pytest.mark.parametrize("a,b", [("2k", "2"), ("5i", "5"), ("-2i", "-2"), ("2pi", "2"), ("2x", "2"),
                                 (r"2\pi", "2"), ("2 x", "2"), ("3 million", "3"), ("2 m^2", "2"),
                                 ("4 ab", "4"), (r"2\text{ k}", "2")])
def test_a_letter_suffix_is_not_a_unit(kind, a, b):
    assert not is_correct(a, b, kind) and not is_correct(b, a, kind)
    assert normalize_answer(a, kind) != normalize_answer(b, kind)


@pytest.mark.parametrize("kind", ["number", "math"])
@pytest.mark.parametrize("a,b", [("5 cm", "5"), ("5cm", "5"), ("12 dollars", "12"), ("3 km/h", "3"),
                                 ("1.5 m/s", "1.5"), ("1.5 m/s", "3/2"), ("$5", "5"), ("5%", "5"),
                                 ("60 miles per hour", "60"), ("20 mph", "20"), ("7 square units", "7"),
                                 ("12 cm^2", "12"), ("4 Hours", "4"), ("2.5 kg", "2.5"), ("3 ft.", "3"),
                                 ("1,000 meters", "1000"), (r"5\text{ cm}", "5"), (r"5 \text{cm}", "5"),
                                 (r"864 \mbox{ inches}^2", "864"), (r"5.4 \text{ cents}", "5.4")])
def test_real_units_are_stripped(kind, a, b):
    assert is_correct(a, b, kind) and is_correct(b, a, kind)
    assert normalize_answer(a, kind) == normalize_answer(b, kind)  # so their votes are one group


def test_compound_units_against_accepted_lists():
    assert is_correct("1.5 m/s", ["1.5", "3/2"], "math")
    assert is_correct("3/2 m/s", ["1.5", "3/2"], "math")
    assert is_correct("30 km/h", ["30"], "math") and not is_correct("2 m/s", ["1.5", "3/2"], "math")


@pytest.mark.parametrize("pred,gold", [("evelyn", r"\text{Evelyn}"), ("EVELYN", r"\text{Evelyn}"),
                                       ("(c)", r"\text{(C)}"), (r"\text{(c)}", "(C)"), ("Ellipse", r"\text{ellipse}"),
                                       (r"\text{ Navin }", r"\text{Navin}")])
def test_text_answers_ignore_case(pred, gold):
    assert is_correct(pred, gold, "math") and is_correct(gold, pred, "math")


@pytest.mark.parametrize("pred,gold", [("x", "X"), ("(d)", r"\text{(C)}"), ("navin", r"\text{Evelyn}"),
                                       ("c", r"\text{(C)}")])
def test_case_still_counts_in_maths(pred, gold):
    assert not is_correct(pred, gold, "math")


def test_decimals_compare_exactly_and_only_endless_ones_loosely():
    for kind in ("number", "math"):
        assert not is_correct("2880001", "2880000", kind) and not is_correct("1450000.5", "1450000", kind)
        assert is_correct("2,880,000.0", "2880000", kind)
    assert is_correct("0.3333333", r"\frac13", "math") and not is_correct("0.33", r"\frac13", "math")


@pytest.mark.parametrize("text,choices,want", [
    ("Answer: 15", ["-30", "+30", "0", "15", "-15"], "D"),  # not also "-15"
    ("Answer: -15", ["-30", "+30", "0", "15", "-15"], "E"),
    ("Answer: Rr", ["R", "rr", "Rr", "RR"], "C"),
    ("Answer: Rs. 750", ["Rs. 697.50", "Rs. 750", "Rs. 780"], "B"),  # "Rs." does not end the answer
    ("Answer: Mt. McKinley.", ["Mt. McKinley", "Niagara Falls"], "A"),
    ("Answer: 8.75", ["8.75", "8.79", "8.75"], None),  # two options say it: it names neither
])
def test_an_options_text_names_it(text, choices, want):
    assert extract_answer(text, "choice", choices) == want


@pytest.mark.parametrize("text,want", [(r"\boxed{2k}", "2k"), ("The answer is 5i.", "5i"), ("Answer: -2i", "-2i"),
                                       ("The answer is 2x.", "2x"), (r"\boxed{5m}", "5"), ("The answer is 12 cookies.", "12"),
                                       ("The answer is 3rd.", "3"), (r"\boxed{1,200 cm}", "1200")])
def test_number_extraction_keeps_a_letter_stuck_to_the_number(text, want):
    assert extract_answer(text, "number") == want
    assert Task("t", "q", None, "2", "number").check(text) == (want == "2")


def test_votes_group_the_way_the_check_judges():
    vote = plurality(["2k", "2", "2 cm", "5i"], "math", "t")
    assert vote.counts[normalize_answer("2", "math")] == 2 and len(vote.counts) == 3
    vote = plurality(["evelyn", r"\text{Evelyn}", "Navin"], "math", "t")
    assert vote.answer == normalize_answer("Evelyn", "math") and vote.counts[vote.answer] == 2
    task = Task("t", "q", None, "2", "math")
    assert task.check(r"So \boxed{2 \text{ cm}}.") and not task.check(r"So \boxed{2k}.")


# One gold of each shape, with the perturbations the data test below applies to every gold.
FIXED = [Task("n", "q", None, "1450000", "number"), Task("m", "q", None, r"\frac{14}{3}", "math"),
         Task("p", "q", None, "6 - 5i", "math"), Task("t", "q", None, r"\text{Evelyn}", "math"),
         Task("o", "q", None, r"\text{(C)}", "math"), Task("u", "q", None, r"5.4 \text{ cents}", "math"),
         Task("c", "q", ["x", "y", "z"], "B", "choice"), Task("b", "q", None, "no", "bool"),
         Task("v", "q", None, "win", "verdict"),
         Task("l", "q", None, "0.75", "math", {"accepted": ["0.75", "75%", "3/4"], "incorrect": ["0.9"]})]


@pytest.mark.parametrize("task", FIXED, ids=[t.id for t in FIXED])
def test_fixed_golds_against_their_perturbations(task):
    assert _failures(task) == []


# ------------------------------------------------------------------ every gold in ../shared/data

SPLIT = {"gsm8k.jsonl": "gsm8k", "math500.jsonl": "math500", "aqua.jsonl": "aqua", "arc_challenge.jsonl": "arc",
         "boolq.jsonl": "boolq", "openbookqa.jsonl": "obqa", "rte.jsonl": "rte",
         "bbh_logical_deduction_three_objects.jsonl": "bbh", "bbh_logical_deduction_seven_objects.jsonl": "bbh",
         "bbh_tracking_shuffled_objects_seven_objects.jsonl": "bbh"}


def test_every_gold_in_shared_data_against_its_perturbations():
    if not DATA.is_dir():
        pytest.skip("no ../shared/data")
    tasks = {name: load_jsonl(DATA / name, format=fmt) for name, fmt in SPLIT.items() if (DATA / name).exists()}
    for name in ("ciar", "faireval"):  # HumanEval (code) and CommonMT (translation) have no single answer
        tasks[name] = load_resilience_task(name, DATA)
    for t in tasks["ciar"]:
        t.metadata["incorrect"] = t.metadata.get("incorrect answer") or []
    start, failed = time.time(), {}
    for name, ts in tasks.items():
        for t in ts:
            bad = _failures(t)
            if bad:
                failed.setdefault(name, []).append((t.id, bad[:3]))
    assert not failed, {name: (len(f), f[:3]) for name, f in failed.items()}
    assert time.time() - start < 120  # about 20-40 s on one core


# --------------------------------------------------------------------------------- perturbations

def _failures(task):
    """What goes wrong for this task: [(reason, answer)] for each perturbation judged the wrong way."""
    golds = task.accepted if isinstance(task.accepted, list) else [task.accepted]
    bad = [("gold", g) for g in golds if not is_correct(g, task.accepted, task.kind)]
    for g in golds:
        good, wrong = _perturb(str(g), task)
        bad += [("rejected", a) for a in good if not _accepts(task, a)]
        bad += [("accepted", a) for a in wrong if _accepts(task, a)]
    bad += [("accepted", a) for a in task.metadata.get("incorrect", []) if _accepts(task, a)]
    return bad


def _accepts(task, answer):
    """Model outputs (with their wording) go through extraction; bare answers straight to the check."""
    if isinstance(answer, Out):
        return task.check(answer)
    return task.accepts(answer)


class Out(str):
    """A whole model output, not an extracted answer."""


def _perturb(g, task):
    """(harmless, harmful) spellings of one gold answer."""
    if task.kind == "choice":
        others = [x for x in task.letters if x != g]
        text = task.choices[task.letters.index(g)]
        named = [Out(f"Answer: {text}")] if task.choices.count(text) == 1 else []  # two equal options: neither
        return ([g.lower(), f"({g.lower()})", f"{g}.", rf"\text{{({g})}}", f" {g} ", *named,
                 Out(f"The answer is ({g})."), Out(rf"$\boxed{{{g}}}$")],
                [*others, Out(f"The answer is ({others[0]}).")])
    if task.kind == "bool":
        other = "no" if g == "yes" else "yes"
        return ([g.upper(), g.title(), f" {g}. ", "true" if g == "yes" else "false", Out(f"The answer is {g.title()}."),
                 Out(rf"\boxed{{{g}}}")],
                [other, other.title(), Out(f"The answer is {other}.")])
    if task.kind == "verdict":
        other = [v for v in ("win", "lose", "tie") if v != g]
        said = {"win": "Assistant 1", "lose": "Assistant 2", "tie": "tie"}
        return [g.upper(), Out(f"Verdict: {said[g]}")], [*other, Out(f"Verdict: {said[other[0]]}")]
    good = [f" {g} ", f"${g}$", Out(rf"So the answer is $\boxed{{{g}}}$."), Out(f"The answer is {g}.")]
    num = re.fullmatch(r"-?\d+(?:\.\d+)?", g)
    n = float(g) if num else None
    # a letter after a last term of 0 leaves it 0 ("0k" is 0, "= 0x" the same equation)
    wrong = [g + "k", g + "i", g + "x", g + " x"] if n != 0 and not re.search(r"(?<![\d.])0$", g) else []
    if num:
        good += [f"{g}.0" if "." not in g else g + "0", f"{g} cm", f"{g} dollars", f"{g} km/h", f"{g}\\text{{ m}}"]
        if "." not in g and abs(int(g)) >= 1000:
            good.append(f"{int(g):,}")
        bump = int(g) + 1 if "." not in g else round(n + 10 ** -len(g.split(".")[1]), 10)
        wrong += [str(bump), f"{g} million"] + ([g + "pi"] if n else [])
        if n != 0:
            wrong.append(g[1:] if g.startswith("-") else "-" + g)
    elif g.endswith("%"):
        good += [g[:-1] + r"\%", g[:-1] + " percent"]
    elif re.fullmatch(r"\\text\{[^{}]+\}", g):  # a word or an option: case does not matter
        inner = g[6:-1]
        good += [inner.lower(), inner.upper(), rf"\text{{{inner.lower()}}}"]
    else:
        wrong.append(g + "+1")
    return good, wrong


# Issue 30: the conclusion wins over letters named in the reasoning. The reference reads the first
# "(X)" or "answer is X" it finds; the corrupted agents of the RR injection name the target letter first.
@pytest.mark.parametrize("text, expected", [
    ("(A) would need four moves, so it fails. The answer is D.", "D"),
    ("Option (C) looks right at first, but (C) ignores the tax. Therefore, B is correct.", "B"),
    ("Final choice: B", "B"),
    ("Checking (A), (B) and (C) in turn, the answer must be C", "C"),
    ("B is correct only if the train stops. It does not, so the answer is (A).", "A"),
    ("(A) and (D) are both plausible.", None),  # no conclusion: letters of the working are not guessed at
])
def test_choice_conclusion_wins(text, expected):
    assert extract_answer(text, "choice", ["4km", "5km", "6km", "7km"]) == expected


# Issue 30: negated prose. The reference reads the first yes/no word it finds.
@pytest.mark.parametrize("text, expected", [
    ("That is not true.", "no"),  # was "yes"
    ("The premise does not entail the hypothesis.", "no"),  # was None
    ("The premise entails the hypothesis.", "yes"),
    ("It is not true that the river is dry, so the answer is yes.", "yes"),  # the answer line wins
    ("It is true.", "yes"),
])
def test_bool_negated_prose(text, expected):
    assert extract_answer(text, "bool") == expected


# Issue 30: an unevaluated expression states no number (it was read as its first number, 30).
@pytest.mark.parametrize("text, expected", [
    (r"\boxed{30 \times 2}", None),
    (r"Answer: 15 + 15", None),
    (r"\boxed{2 \cdot 15}", None),
    (r"Answer: 15 * 2 = 30", "30"),  # the value after its last '='
    (r"\boxed{30}", "30"),
])
def test_number_expression_not_first_number(text, expected):
    assert extract_answer(text, "number") == expected


# Issue 30: a reply that states an option's value names that option, in any spacing or currency.
# AQuA's options are "A)4km", "D)Rs. 750", "B)$65", "A)4,000". There is no reference code for
# multiple choice (the Consensus Trap has none public); a reader of letters alone names no option here.
AQUA_LIKE = ["4km", "Rs.250", "$12", "4,000", "36 minutes", "2% Profit", "2% Loss"]


@pytest.mark.parametrize("text, expected", [
    ("Answer: 4 km", "A"), ("The answer is 4 KM.", "A"), ("Answer: 4", "A"),  # the question's unit
    ("Answer: Rs. 250", "B"), ("Answer: Rs 250", "B"), ("Answer: 250 rupees", "B"),
    ("Answer: $12.00", "C"), ("Answer: 12 dollars", "C"), (r"\boxed{\$12}", "C"),
    ("Answer: 4000", "D"), ("Answer: 4,000.", "D"),
    ("Answer: 36 minute", "E"), ("Answer: 36 min", None),  # another spelling of the unit is another unit
    ("Answer: 2% profit", "F"), ("Answer: 2%", None),  # two options say 2%: it names neither
    ("Answer: 4k", None), ("Answer: 12.5", None),
])
def test_choice_option_value_in_other_spelling(text, expected):
    assert extract_answer(text, "choice", AQUA_LIKE) == expected


def test_choice_value_never_matches_by_dropped_punctuation():
    # "12.00" and "1,200" are both "1200" once punctuation is gone; as values they differ.
    assert extract_answer("Answer: $12.00", "choice", ["$1,200", "$12", "$120"]) == "B"
    assert extract_answer("Answer: 1200", "choice", ["$1,200", "$12", "$120"]) == "A"
    assert extract_answer("Answer: +30", "choice", ["-30", "+30", "0", "15", "-15"]) == "B"


# Issue 30: MATH answers. The reference (SAC's normalisation, /work/shared/SYSTEMS.md) strips commas and
# spaces and then asks sympy, so "-1, 3" becomes "-13" against "3-1" (and "1,2" equals "12"); sets,
# base subscripts, matrix brackets, "x \in" and unit words stay as strings there, and differ.
@pytest.mark.parametrize("pred, gold", [
    ("3, -1", "-1, 3"), ("x = 3, x = -1", "-1,3"), ("7, 3, 5", "3, 5, 7"), ("-2,1", "1,-2"),  # golds of MATH-500
    ("1+\\sqrt{19}, 1-\\sqrt{19}", "1 \\pm \\sqrt{19}"), ("3-2\\sqrt{2},3+2\\sqrt{2}", "3 \\pm 2 \\sqrt{2}"),
    ("(3,4), (1,2)", "(1,2), (3,4)"),  # a list of points: any order, each point in its own order
    ("y = 4, x = 3", "x = 3, y = 4"),
    ("x = 3 \\text{ or } x = -1", "-1, 3"), ("-1 and 3", "3, -1"), ("1, 2, and 3", "3, 2, 1"),
    ("12 or 6", "6 or 12"),  # a CIAR gold
])
def test_math_solution_lists_in_any_order(pred, gold):
    assert is_correct(pred, gold, "math") and is_correct(gold, pred, "math")
    assert normalize_answer(pred, "math") == normalize_answer(gold, "math")


@pytest.mark.parametrize("pred, gold", [
    ("(31,6,-1)", "(6,31,-1)"), ("(1,-2)", "(-2,1)"),  # ordered tuples stay ordered
    ("(2,1), (3,4)", "(1,2), (3,4)"), ("x = 4, y = 3", "x = 3, y = 4"),
    ("1, 2", "1, 2, 2"), ("1, 1, 2", "1, 2, 2"), ("1+\\sqrt{19}", "1 \\pm \\sqrt{19}"),
    ("1 or 2", "1"), ("x = 3 or y = 4", "x = 4, y = 3"),  # a hedge is not its first value
    ("(1,2)", "1, 2"), ("12", "1, 2"),  # a point is not a list; the reference calls "1,2" 12
])
def test_math_ordered_answers_stay_ordered(pred, gold):
    assert not is_correct(pred, gold, "math") and not is_correct(gold, pred, "math")


@pytest.mark.parametrize("pred, gold", [
    ("\\{1, 2\\}", "1, 2"), ("\\left\\{ 2, 1 \\right\\}", "1,2"), ("{1, 2}", "2, 1"), ("\\{5\\}", "5"),
])
def test_math_sets_with_or_without_braces(pred, gold):
    assert is_correct(pred, gold, "math") and is_correct(gold, pred, "math")


@pytest.mark.parametrize("pred, gold, same", [
    ("101_{2}", "101_2", True), ("4210_5", "4210_{5}", True), ("204_{5}", "204_5", True),  # 204_5 is a MATH-500 gold
    ("204", "204_5", False), ("204_{6}", "204_5", False),  # another base is another number
    ("\\begin{bmatrix} 1 \\\\ 2 \\end{bmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", True),
    ("\\begin{bmatrix} -\\frac13 \\\\ 2/3 \\end{bmatrix}", "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}", True),
    ("\\begin{pmatrix} 2/3 \\\\ -1/3 \\end{pmatrix}", "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}", False),
    ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", False),  # row vs column
])
def test_math_bases_and_matrices(pred, gold, same):
    assert is_correct(pred, gold, "math") == same and is_correct(gold, pred, "math") == same


@pytest.mark.parametrize("pred, gold, same", [
    ("x \\in [2, 5)", "[2,5)", True), ("[-2,7]", "x \\in [-2,7]", True),  # x \in [-2,7] is a MATH-500 gold
    ("(2,5]", "[2,5)", False), ("[5,2)", "[2,5)", False), ("x \\in (-2,7]", "x \\in [-2,7]", False),  # intervals are ordered
    ("(1,2)", "(1,2)", True), ("(2,1)", "(1,2)", False),  # a point and an interval alike: equal strings only
])
def test_math_intervals(pred, gold, same):
    assert is_correct(pred, gold, "math") == same and is_correct(gold, pred, "math") == same


@pytest.mark.parametrize("pred, gold, same", [
    ("9 pears", "9", True), ("12 red apples", "12", True), ("\\frac{1}{2} pies", "0.5", True),
    ("9 \\text{pears}", "9", True), ("9\\text{ pears}", "9", True), ("9 \\text{million}", "9", False),
    ("3 million", "3", False), ("3 dozen", "3", False), ("5 squared", "5", False), ("3 pi", "3", False),
    ("2 sin x", "2", False), ("4 ab", "4", False), ("10 times", "10", False),
])
def test_math_number_with_a_unit_word(pred, gold, same):
    assert is_correct(pred, gold, "math") == same


def test_math_unit_word_through_extraction():
    task = Task("t", "q", None, "9", "math")
    assert extract_answer("The answer is 9 pears.", "math") == "9 pears"
    assert task.check("The answer is 9 pears.") and task.check(r"So \boxed{9 \text{ pears}}.")
    assert not task.check("The answer is 9 million.")
    assert Task("s", "q", None, "-1, 3", "math").check(r"The answer is $x = 3, x = -1$.")


# Issue 30: a line that is only a conclusion, as AQuA's rationales end ("Answer D", "ANSWER B",
# "correct option is C", "Ans A", a last line "A"), beats a "(B)" in the working above it.
@pytest.mark.parametrize("text, expected", [
    ("P(A/B) = P(A n B)/P(B)\nP(A/B) = 0.16/0.8 = 0.2\nA", "A"),  # was B, from "P(B)"
    ("= 704/22 = 32\nAnswer D", "D"), ("= 85995\nANSWER B", "B"), ("x = 15\nAns A", "A"),
    ("= 438\nanswer.A", "A"), ("So 12.5 hours.\nThe correct option is C.", "C"),
    ("Answer A is wrong: 4 km is too far, so (B).", "B"),  # not a line of its own
])
def test_choice_conclusion_line(text, expected):
    assert extract_answer(text, "choice", ["4km", "5km", "6km", "7km", "8km"]) == expected
