"""A seeded generator of realistic model replies, each with the reading a careful human grader gives it.

    corpus(per_group, seed)   -> [Item(kind, text, choices, expected, category)], per_group items per group
    sample(per_group, seed)   -> a fixed random subset of the full corpus, per_group items per group
    judge(item, status, value) -> "right" or the kind of misreading ("wrong value", "read when ambiguous", ...)

An item's `expected` is the value the reply commits to (an option letter, a number, a LaTeX answer, "yes"/"no",
"win"/"lose"/"tie", or a float for judge scores and confidences), AMBIGUOUS when the reply ends by committing to
two different answers, or UNREAD when it commits to nothing (cut off mid-working, undecided). The expectation
comes from how each reply is built, never from a reader: the corpus is the independent judge of the readers.

Groups (the first part of `category`, "letter/refutation"): option letters and option texts (kind "choice"), GSM8K
numbers ("number"), MATH-500 answers ("math"), BoolQ yes/no and RTE entailment ("bool"), FairEval verdicts
("verdict"), SAC judge scores ("score") and CP-WBFT confidences ("confidence"). Questions, options and gold values
come from the real records in ../shared/data when that directory exists, and from a small set of records made here
when it does not (CI has no ../shared); the data is read in place, never copied.
"""

import json
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"
AMBIGUOUS = "<ambiguous>"
UNREAD = "<unread>"
LETTERS = "ABCDEFGHIJ"
PER_GROUP = 360
BBH_FILES = ("bbh_logical_deduction_three_objects.jsonl", "bbh_logical_deduction_seven_objects.jsonl",
             "bbh_tracking_shuffled_objects_three_objects.jsonl", "bbh_tracking_shuffled_objects_seven_objects.jsonl")
NBSP = "\u00a0"
MINUS = "\u2212"


class Item(NamedTuple):
    kind: str        # the reader's kind: choice, number, math, bool, verdict, score, confidence
    text: str        # the reply
    choices: list    # option texts for "choice", else None
    expected: object  # the committed value, AMBIGUOUS or UNREAD
    category: str    # "group/form"

    @property
    def group(self):
        return self.category.split("/", 1)[0]


@dataclass(frozen=True)
class Record:
    question: str
    gold: str                          # letter, number, LaTeX, yes/no, win/lose/tie
    choices: tuple = None
    context: tuple = field(default=())  # passage, premise/hypothesis, the two assistants' answers


# ------------------------------------------------------------------------------------------------ records

def _jsonl(data_dir, name):
    path = Path(data_dir) / name
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def choice_records(data_dir):
    """{source: [Record]} of AQuA, BBH (four tasks), ARC-Challenge and OpenBookQA."""
    sources = {}
    sources["aqua"] = [Record(r["question"], r["correct"].strip().upper(),
                              tuple(re.sub(r"^\s*[A-Ea-e]\s*\)\s*", "", o) for o in r["options"]))
                       for r in _jsonl(data_dir, "aqua.jsonl")]
    for name in BBH_FILES:
        recs = []
        for r in _jsonl(data_dir, name):
            question, options = r["input"].split("\nOptions:\n", 1)
            choices = tuple(re.sub(r"^\([A-J]\)\s*", "", o) for o in options.strip().split("\n"))
            recs.append(Record(question, r["target"].strip().strip("()"), choices))
        sources[name.removesuffix(".jsonl")] = recs
    for name in ("arc_challenge", "openbookqa"):
        sources[name] = [Record(re.sub(r"^Question:\s*", "", r["query"]), LETTERS[int(r["gold"])], tuple(r["choices"]))
                         for r in _jsonl(data_dir, name + ".jsonl")]
    return _or_made(sources, made_choice_records)


def number_records(data_dir):
    recs = [Record(r["question"], r["final_answer"].replace(",", "").strip()) for r in _jsonl(data_dir, "gsm8k.jsonl")]
    return _or_made({"gsm8k": recs}, made_number_records)


def math_records(data_dir):
    recs = [Record(r["problem"], r["answer"].strip()) for r in _jsonl(data_dir, "math500.jsonl")]
    return _or_made({"math500": recs}, made_math_records)


def boolq_records(data_dir):
    recs = []
    for r in _jsonl(data_dir, "boolq.jsonl"):
        passage, _, question = r["query"].partition("\nQuestion:")
        recs.append(Record(question.strip(), str(r["choices"][int(r["gold"])]).lower(),
                           context=(passage.removeprefix("Passage:").strip(),)))
    return _or_made({"boolq": recs}, made_boolq_records)


def rte_records(data_dir):
    recs = [Record("Does the premise entail the hypothesis?", "yes" if r["label"] == "entailment" else "no",
                   context=(r["premise"], r["hypothesis"])) for r in _jsonl(data_dir, "rte.jsonl")]
    return _or_made({"rte": recs}, made_rte_records)


def faireval_records(data_dir):
    """FairEval with the gpt35 answer shown as Assistant 1 (the project's default order): gpt35 -> win."""
    gold = {"gpt35": "win", "vicuna": "lose", "tie": "tie"}
    recs = [Record(r["question"], gold[r["human_label"]], context=(r["response"]["gpt35"], r["response"]["vicuna"]))
            for r in _jsonl(data_dir, "faireval.jsonl")]
    return _or_made({"faireval": recs}, made_verdict_records)


def _or_made(sources, make):
    sources = {k: v for k, v in sources.items() if v}
    return sources or {"made": make(random.Random(7))}


# Records made here for a checkout without ../shared: simple questions whose gold is computed.

def made_choice_records(rng):
    recs = []
    for _ in range(40):
        values = rng.sample(range(10, 300), rng.choice((3, 4, 5)))
        recs.append(Record("Which of these numbers is the largest?", LETTERS[values.index(max(values))],
                           tuple(str(v) for v in values)))
    things = [("a pear", "fruit"), ("a hammer", "tool"), ("a violin", "instrument"), ("a sparrow", "bird"),
              ("a trout", "fish"), ("a tulip", "flower")]
    for _ in range(40):
        picked = rng.sample(things, 4)
        target = rng.randrange(4)
        recs.append(Record(f"Which of these is a {picked[target][1]}?", LETTERS[target], tuple(t for t, _ in picked)))
    return recs


def made_number_records(rng):
    recs = []
    for _ in range(60):
        a, b, c = rng.randint(3, 40), rng.randint(2, 12), rng.randint(15, 140)
        recs.append(Record(f"Sam has {a} apples and buys {b} crates of {c} apples each. How many apples does he have?",
                           str(a + b * c)))
    for _ in range(20):
        a, b = rng.randint(1, 9), rng.randint(10, 25)
        recs.append(Record(f"The temperature was {a} degrees and fell by {b} degrees. What is it now?", str(a - b)))
    return recs


def made_math_records(rng):
    recs = []
    for _ in range(40):
        a, b, c, d = rng.randint(1, 9), rng.randint(2, 9), rng.randint(1, 9), rng.randint(2, 9)
        s = Fraction(a, b) + Fraction(c, d)
        gold = str(s.numerator) if s.denominator == 1 else rf"\frac{{{s.numerator}}}{{{s.denominator}}}"
        recs.append(Record(rf"Compute $\frac{{{a}}}{{{b}}} + \frac{{{c}}}{{{d}}}$.", gold))
    for _ in range(20):
        a, b = rng.randint(5, 30), rng.randint(1, 20)
        recs.append(Record(f"Solve $x + {a} = {b}$ for $x$.", str(b - a)))
    for _ in range(20):
        n, k = rng.randint(2, 9), rng.choice((2, 3, 5, 7))
        recs.append(Record(rf"Simplify $\sqrt{{{n * n * k}}}$.", rf"{n}\sqrt{{{k}}}"))
    return recs


def made_boolq_records(rng):
    recs = []
    for _ in range(60):
        n = rng.randint(10, 99)
        prime = all(n % p for p in range(2, 10) if p < n)
        passage = f"A prime number has exactly two divisors. The number {n} {'is' if prime else 'is not'} prime."
        recs.append(Record(f"is {n} a prime number?", "yes" if prime else "no", context=(passage,)))
    return recs


def made_rte_records(rng):
    names, things, cities = ["Ana", "Omar", "Li", "Marta"], ["bicycle", "piano", "lamp"], ["Lyon", "Oslo", "Quito"]
    recs = []
    for _ in range(60):
        name, thing, city, other = rng.choice(names), rng.choice(things), *rng.sample(cities, 2)
        premise = f"{name} bought a {thing} in {city} last week."
        hypothesis, gold = rng.choice([(f"{name} bought a {thing}.", "yes"), (f"{name} sold a {thing}.", "no"),
                                       (f"{name} bought a {thing} in {other}.", "no")])
        recs.append(Record("Does the premise entail the hypothesis?", gold, context=(premise, hypothesis)))
    return recs


def made_verdict_records(rng):
    recs = []
    for _ in range(30):
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        right, wrong = f"{a} times {b} is {a * b}.", f"{a} times {b} is {a * b + 1}."
        gold = rng.choice(["win", "lose", "tie"])
        first, second = {"win": (right, wrong), "lose": (wrong, right), "tie": (right, right)}[gold]
        recs.append(Record(f"What is {a} times {b}?", gold, context=(first, second)))
    return recs


# ------------------------------------------------------------------------------------------------ helpers

def _words(s, n):
    words = str(s).split()
    return " ".join(words[:n]) + (" ..." if len(words) > n else "")


def _digits(x):
    """A Fraction as a plain decimal string (golds and distractors of GSM8K are integers or short decimals)."""
    if x.denominator == 1:
        return str(x.numerator)
    return format(float(x), "f").rstrip("0").rstrip(".")


def _thousands(s, sep=","):
    m = re.fullmatch(r"(-?)(\d+)(\.\d+)?", s)
    if not m:
        return s
    sign, whole, frac = m.groups()
    return sign + f"{int(whole):,}".replace(",", sep) + (frac or "")


def _fullwidth(s):
    return s.translate({ord(c): 0xFF10 + int(c) for c in "0123456789"})


def _plain_value(latex):
    """The number a simple LaTeX answer denotes ("-3", "1.25", "\\frac{3}{4}"), else None."""
    s = latex.replace(" ", "").replace("$", "")
    if re.fullmatch(r"-?\d+(\.\d+)?", s):
        return Fraction(s)
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", s)
    if m and int(m.group(3)):
        return (-1 if m.group(1) else 1) * Fraction(int(m.group(2)), int(m.group(3)))
    return None


def arithmetic(rng, k):
    """k lines of working with numbers, none of them a conclusion."""
    lines = []
    for _ in range(k):
        a, b = rng.randint(2, 90), rng.randint(2, 40)
        op, c = rng.choice([("+", a + b), ("-", a - b), ("×", a * b), ("*", a * b)])
        lines.append(rng.choice([f"{a} {op} {b} = {c}.", f"That gives {a} {op} {b} = {c}.",
                                 f"Next, {a} {op} {b} is {c}.", f"We get {c} from {a} {op} {b}.",
                                 f"So far: {a} {op} {b} = {c}, which we carry forward.",
                                 f"Checking: {a} {op} {b} gives {c}, as expected."]))
    return lines


def latex_steps(rng, k):
    lines = []
    for _ in range(k):
        a, b, c = rng.randint(2, 12), rng.randint(2, 30), rng.randint(2, 9)
        lines.append(rng.choice([rf"We have $x^2 - {a}x + {b} = 0$.", rf"Multiplying both sides by ${c}$ gives ${c * b}$.",
                                 rf"The factor $\frac{{{b}}}{{{c}}}$ comes back in the next step.",
                                 rf"Substituting $y = {a}$ gives $2y + {b} = {2 * a + b}$.",
                                 rf"Then $\sqrt{{{a * a}}} = {a}$, so the term is ${a}$.",
                                 rf"Expanding, $({a} + {c})^2 = {(a + c) ** 2}$."]))
    return lines


NEUTRAL = ("let me check it against the question", "this needs a closer look", "compare it with what is asked",
           "keep it in mind for now", "check it against each statement", "test it step by step")
REASONS = ("it contradicts the second statement", "the numbers do not add up", "it ignores a condition in the question",
           "it miscounts one of the steps", "the order given rules it out", "it does not match the facts given")


def fill(template, **values):
    """str.format without braces: LaTeX answers keep theirs."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", str(value))
    return template


# ------------------------------------------------------------------------------------------------ groups

class Group:
    """How one answer kind's replies are written: the value a reply commits to, how it is said, the working."""
    name = kind = ""
    markers = ("Answer", "Final answer", "Final Answer")
    noun = ("answer", "final answer")

    def __init__(self, sources):
        self.sources = sources

    def pick(self, rng):
        return rng.choice(self.sources[rng.choice(sorted(self.sources))])

    def target(self, rec, rng):
        return rec.gold

    def expected(self, rec, value):
        return value

    def other(self, rec, value, rng):
        raise NotImplementedError

    def short(self, rec, value, rng):
        return value

    def spoken(self, rec, value, rng):
        return self.short(rec, value, rng)

    def mention(self, rec, value, rng):
        return self.spoken(rec, value, rng)

    def working(self, rec, rng):
        raise NotImplementedError

    def choices(self, rec):
        return None


class LetterGroup(Group):
    name, kind = "letter", "choice"
    markers = ("Answer", "Final answer", "Correct answer", "Correct option", "Final choice")
    noun = ("answer", "correct answer", "correct option", "correct choice", "best option")

    def choices(self, rec):
        return list(rec.choices)

    def letters(self, rec):
        return LETTERS[:len(rec.choices)]

    def option_text(self, rec, letter):
        return rec.choices[LETTERS.index(letter)]

    def other(self, rec, value, rng):
        return rng.choice([x for x in self.letters(rec) if x != value])

    def short(self, rec, value, rng):
        return rng.choice([value, f"({value})"])

    def spoken(self, rec, value, rng):
        text = self.option_text(rec, value)
        return rng.choice([value, f"({value})", f"({value})", f"option {value}", f"option ({value})", f"choice {value}",
                           f"({value}) {text}", f"{value}) {text}"])

    def mention(self, rec, value, rng):
        return rng.choice([f"({value})", f"option {value}", f"Option ({value})", f"{value})"])

    def working(self, rec, rng):
        lines = [f"The question: {_words(rec.question, 18)}"]
        for letter in rng.sample(self.letters(rec), min(3, len(rec.choices))):
            lines.append(f"{self.mention(rec, letter, rng)} {_words(self.option_text(rec, letter), 10)}: "
                         f"{rng.choice(NEUTRAL)}.")
        if rng.random() < 0.5:
            lines += arithmetic(rng, rng.randint(1, 3))
        return "\n".join(lines)


class OptionTextGroup(LetterGroup):
    """The reply names the option by its own text or value ("Answer: a marsh", "Rs. 250"); expected is its letter."""
    name = "option_text"

    def __init__(self, sources):
        # only options a grader can tell apart by text: unique, not a bare letter, short enough to be written out
        def plain(s):
            return re.sub(r"[^0-9a-z]+", "", s.lower())

        def usable(rec):
            texts = [plain(c) for c in rec.choices]
            gold = texts[LETTERS.index(rec.gold)]
            return (texts.count(gold) == 1 and len(gold) > 1 and len(rec.choices[LETTERS.index(rec.gold)]) <= 80
                    and all(len(t) > 1 and texts.count(t) == 1 for t in texts))
        super().__init__({k: [r for r in v if usable(r)] for k, v in sources.items()})
        self.sources = {k: v for k, v in self.sources.items() if v}

    def short(self, rec, value, rng):
        text = self.option_text(rec, value)
        return rng.choice([text, text, text.lower(), text.rstrip(".")])

    def spoken(self, rec, value, rng):
        text = self.short(rec, value, rng)
        return rng.choice([text, f"“{text}”", f"'{text}'", f"**{text}**"])

    def mention(self, rec, value, rng):
        return f"“{_words(self.option_text(rec, value), 10)}”"

    def working(self, rec, rng):
        lines = [f"The question: {_words(rec.question, 18)}"]
        for letter in rng.sample(self.letters(rec), min(3, len(rec.choices))):
            lines.append(f"Consider {self.mention(rec, letter, rng)}: {rng.choice(NEUTRAL)}.")
        if rng.random() < 0.5:
            lines += arithmetic(rng, rng.randint(1, 3))
        return "\n".join(lines)


class NumberGroup(Group):
    name, kind = "number", "number"
    noun = ("answer", "final answer", "total", "result")

    def other(self, rec, value, rng):
        x = Fraction(value)
        while True:
            y = rng.choice([x + rng.randint(1, 30), x - rng.randint(1, 30), x * 2, x + 10 * rng.randint(1, 9), x / 2])
            if y != x and (y >= 0 or x < 0) and (y.denominator == 1 or x.denominator != 1):
                return _digits(y)

    def short(self, rec, value, rng):
        return _thousands(value) if abs(Fraction(value)) >= 1000 and rng.random() < 0.5 else value

    def spoken(self, rec, value, rng):
        s = self.short(rec, value, rng)
        if "$" in rec.question and not s.startswith("-") and rng.random() < 0.5:
            return "$" + s
        return s

    def working(self, rec, rng):
        return "\n".join([f"We need: {_words(rec.question, 20)}"] + arithmetic(rng, rng.randint(2, 5)))


class MathGroup(Group):
    name, kind = "math", "math"

    def other(self, rec, value, rng):
        mine = _plain_value(value)
        while True:
            y = rng.choice([str(rng.randint(2, 99)), rf"\frac{{{rng.randint(1, 20)}}}{{{rng.randint(21, 40)}}}"])
            if y != value and _plain_value(y) != mine:
                return y

    def spoken(self, rec, value, rng):
        forms = [f"${value}$", f"${value}$", rf"\({value}\)"]
        return rng.choice(forms + ([value] if "\\" not in value and "^" not in value else []))

    def mention(self, rec, value, rng):
        return f"${value}$"

    def working(self, rec, rng):
        return "\n".join([f"We are asked: {_words(rec.question, 20)}"] + latex_steps(rng, rng.randint(2, 5)))


class YesNoGroup(Group):
    name, kind = "yesno", "bool"

    def other(self, rec, value, rng):
        return "no" if value == "yes" else "yes"

    def short(self, rec, value, rng):
        return rng.choice([value, value.capitalize(), value.upper()])

    def working(self, rec, rng):
        passage = rec.context[0]
        return (f"The question is: {rec.question}\nThe passage says: \"{_words(passage, rng.randint(15, 40))}\"\n"
                f"{rng.choice(NEUTRAL).capitalize()}.")


class EntailmentGroup(YesNoGroup):
    name = "entailment"
    markers = ("Answer", "Final answer", "Label", "Relation")
    noun = ("answer", "label", "relation")
    LABELS = {"yes": ("entailment", "Entailment", "entailment", "yes", "entailed"),
              "no": ("not entailment", "not_entailment", "Not entailment", "no", "no entailment", "non-entailment")}
    SENTENCES = {"yes": ("the hypothesis is entailed by the premise", "the premise entails the hypothesis",
                         "the hypothesis follows from the premise", "the hypothesis does follow from the premise",
                         "the premise supports the hypothesis, so this is entailment"),
                 "no": ("the hypothesis is not entailed by the premise", "the premise does not entail the hypothesis",
                        "the hypothesis does not follow from the premise", "the hypothesis does not follow",
                        "this is not entailment")}

    def short(self, rec, value, rng):
        return rng.choice(self.LABELS[value])

    def sentence(self, rec, value, rng):
        return rng.choice(self.SENTENCES[value])

    def mention(self, rec, value, rng):
        return f"“{self.short(rec, value, rng)}”"  # quoted: "it isn't “not entailment”" reads as one label

    def working(self, rec, rng):
        premise, hypothesis = rec.context
        return (f"Premise: \"{_words(premise, rng.randint(12, 35))}\"\nHypothesis: \"{hypothesis}\"\n"
                f"{rng.choice(NEUTRAL).capitalize()}.")


class VerdictGroup(Group):
    name, kind = "verdict", "verdict"
    markers = ("Verdict", "Final verdict")
    noun = ("verdict", "final verdict")
    SHORT = {"win": ("Assistant 1", "Assistant 1", "assistant 1"), "lose": ("Assistant 2", "Assistant 2", "assistant 2"),
             "tie": ("tie", "Tie", "a tie")}
    SENTENCES = {"win": ("Assistant 1 is better", "Assistant 1 gave the better answer", "Assistant 1 wins",
                         "the first assistant's answer is better"),
                 "lose": ("Assistant 2 is better", "Assistant 2 gave the better answer", "Assistant 2 wins",
                          "the second assistant's answer is better"),
                 "tie": ("it is a tie", "both assistants are equally good, so it's a tie",
                         "neither answer is better: a tie")}

    def other(self, rec, value, rng):
        return rng.choice([v for v in ("win", "lose", "tie") if v != value])

    def short(self, rec, value, rng):
        return rng.choice(self.SHORT[value])

    def sentence(self, rec, value, rng):
        return rng.choice(self.SENTENCES[value])

    def mention(self, rec, value, rng):
        return self.short(rec, value, rng)

    def working(self, rec, rng):
        first, second = rec.context
        return (f"The user asked: {_words(rec.question, 20)}\n"
                f"Assistant 1 writes: \"{_words(first, rng.randint(10, 30))}\"\n"
                f"Assistant 2 writes: \"{_words(second, rng.randint(10, 30))}\"\n"
                f"Both address the question; {rng.choice(NEUTRAL)}.")


SCORE_GRID = tuple(Fraction(i, 20) for i in range(21))


def _decimal(x):
    return _digits(x) if x.denominator != 1 else f"{x.numerator}.0"


class ScoreGroup(Group):
    """SAC judge replies: a score in [0, 1] for another agent's answer (Records give the question judged)."""
    name, kind = "score", "score"
    markers = ("Score", "Final score", "Rating", "Score (0-1)")
    noun = ("score", "final score", "rating")

    def target(self, rec, rng):
        return rng.choice(SCORE_GRID)

    def expected(self, rec, value):
        return float(value)

    def other(self, rec, value, rng):
        return rng.choice([x for x in SCORE_GRID if abs(x - value) >= Fraction(1, 10)])

    def short(self, rec, value, rng):
        return _decimal(value)

    def spoken(self, rec, value, rng):
        forms = [_decimal(value), _decimal(value)]
        if (value * 10).denominator == 1:
            forms.append(f"{value * 10}/10")
        if (value * 100).denominator == 1:
            forms.append(f"{value * 100}%")
        return rng.choice(forms)

    def working(self, rec, rng):
        claimed = rec.gold if re.fullmatch(r"-?\d+(\.\d+)?", rec.gold) else str(rng.randint(2, 500))
        return "\n".join([f"The question: {_words(rec.question, 16)}", f"The candidate answer is {claimed}."]
                         + arithmetic(rng, rng.randint(1, 4))
                         + [f"The candidate's reasoning {rng.choice(('holds up', 'skips a step', 'is mostly sound'))}."])


class ConfidenceGroup(ScoreGroup):
    """CP-WBFT replies: the agent's own answer, then its confidence in [0, 1]."""
    name, kind = "confidence", "confidence"
    markers = ("Confidence", "Confidence score", "Confidence level", "Confidence (0-1)", "confidence")
    noun = ("confidence", "confidence level", "confidence score")

    def target(self, rec, rng):
        return rng.choice(SCORE_GRID[4:])

    def spoken(self, rec, value, rng):
        forms = [_decimal(value), _decimal(value)]
        if (value * 100).denominator == 1:
            forms.append(f"{value * 100}%")
        return rng.choice(forms)

    def working(self, rec, rng):
        answer = rec.gold if re.fullmatch(r"-?\d+(\.\d+)?", rec.gold) else str(rng.randint(2, 500))
        return "\n".join([f"We need: {_words(rec.question, 16)}"] + arithmetic(rng, rng.randint(1, 4))
                         + [rng.choice([f"Answer: {answer}", f"**Answer:** {answer}", f"The answer is {answer}."])])


# ------------------------------------------------------------------------------------------------ forms
# Each form: (group, rec, rng) -> (text, expected). Forms that commit end with the group's conclusion.

def _say_is(g, rec, value, rng):
    """A concluding sentence: "The answer is (B).", "Verdict: Assistant 1", "So the score is 0.8."."""
    if hasattr(g, "sentence") and rng.random() < 0.5:
        return rng.choice(["So {s}.", "Therefore, {s}.", "Overall, {s}.", "In conclusion, {s}."]).replace(
            "{s}", g.sentence(rec, value, rng))
    return fill(rng.choice(["The {n} is {v}.", "So the {n} is {v}.", "Therefore, the {n} is {v}.", "Thus the {n} is {v}.",
                            "Hence, the {n} is {v}."]), n=rng.choice(g.noun), v=g.spoken(rec, value, rng))


def _bare_value_reads(g):
    """Does a value said without its noun commit? "Probably (B)." does; "Probably 0.8." in a reply that also
    states an answer does not say that 0.8 is a score or a confidence."""
    return g.kind not in ("score", "confidence")


def _marker(g, rec, value, rng):
    return f"{rng.choice(g.markers)}: {g.short(rec, value, rng)}"


def _conclude(g, rec, value, rng):
    return rng.choice([_say_is, _marker])(g, rec, value, rng)


def _reply(*parts):
    return "\n\n".join(p for p in parts if p)


def form_answer_is(g, rec, rng):
    v = g.target(rec, rng)
    return _reply(g.working(rec, rng), _say_is(g, rec, v, rng)), g.expected(rec, v)


def form_marker_colon(g, rec, rng):
    v = g.target(rec, rng)
    return _reply(g.working(rec, rng), _marker(g, rec, v, rng)), g.expected(rec, v)


def form_marker_bold(g, rec, rng):
    v = g.target(rec, rng)
    line = fill(rng.choice(["**{M}:** {v}", "**{M}**: {v}", "{M}: **{v}**", "**{M}: {v}**"]),
                M=rng.choice(g.markers), v=g.short(rec, v, rng))
    return _reply(g.working(rec, rng), line), g.expected(rec, v)


def form_marker_dash(g, rec, rng):
    v = g.target(rec, rng)
    line = f"{rng.choice(g.markers)} {rng.choice(['-', '—', '–'])} {g.short(rec, v, rng)}"
    return _reply(g.working(rec, rng), line), g.expected(rec, v)


def form_marker_brackets(g, rec, rng):
    v = g.target(rec, rng)
    s = g.short(rec, v, rng).strip("()") if g.name == "letter" else g.short(rec, v, rng)
    return _reply(g.working(rec, rng), f"{rng.choice(g.markers)}: [{s}]"), g.expected(rec, v)


def form_heading(g, rec, rng):
    v = g.target(rec, rng)
    head = fill(rng.choice(["## {M}\n\n{v}", "### {M}\n{v}", "**{M}**\n\n{v}", "# {M}\n{v}"]),
                M=rng.choice(g.markers), v=g.short(rec, v, rng))
    return _reply("## Working\n\n" + g.working(rec, rng), head), g.expected(rec, v)


def form_bullets(g, rec, rng):
    v = g.target(rec, rng)
    lines = ["- " + line for line in g.working(rec, rng).split("\n") if line.strip()]
    lines.append(fill(rng.choice(["- **{M}:** {v}", "- {M}: {v}", "* {M}: {v}", "1. {M}: {v}"]),
                      M=rng.choice(g.markers), v=g.short(rec, v, rng)))
    return "\n".join(lines), g.expected(rec, v)


def form_textbf(g, rec, rng):
    v = g.target(rec, rng)
    s = g.short(rec, v, rng)
    line = rng.choice([f"{rng.choice(g.markers)}: \\textbf{{{s}}}", f"The {rng.choice(g.noun)} is \\textbf{{{s}}}.",
                       f"$\\textbf{{{s}}}$"])
    return _reply(g.working(rec, rng), line), g.expected(rec, v)


def form_go_with(g, rec, rng):
    v = g.target(rec, rng)
    line = fill(rng.choice(["I'd go with {v}.", "I'll go with {v}.", "I would go with {v}.", "My pick is {v}.",
                            "I'm going with {v}."]), v=g.spoken(rec, v, rng))
    return _reply(g.working(rec, rng), line), g.expected(rec, v)


def form_boxed(g, rec, rng):
    v = g.target(rec, rng)
    s = g.short(rec, v, rng)
    if g.kind in ("choice", "bool") and rng.random() < 0.4:
        s = f"\\text{{{s}}}"
    line = rng.choice([f"\\boxed{{{s}}}", f"${{\\boxed{{{s}}}}}$", f"$\\boxed{{{s}}}$", f"\\[\\boxed{{{s}}}\\]",
                       f"The {rng.choice(g.noun)} is $\\boxed{{{s}}}$."])
    return _reply(g.working(rec, rng), line), g.expected(rec, v)


def form_closing_line(g, rec, rng):
    v = g.target(rec, rng)
    return _reply(g.working(rec, rng), g.short(rec, v, rng)), g.expected(rec, v)


def form_names_others(g, rec, rng):
    v = g.target(rec, rng)
    o1, o2 = g.other(rec, v, rng), g.other(rec, v, rng)
    middle = fill(rng.choice(["At first glance {a} looks plausible, and {b} is close too; let me check both.",
                              "Several candidates come up: {a}, {b}, and a third one.",
                              "Someone might pick {a}; another reading gives {b}.",
                              "I compared {a} with {b} before settling."]),
                  a=g.mention(rec, o1, rng), b=g.mention(rec, o2, rng))
    return _reply(g.working(rec, rng), middle, _conclude(g, rec, v, rng)), g.expected(rec, v)


def form_refutation(g, rec, rng):
    v = g.target(rec, rng)
    o = g.other(rec, v, rng)
    om, vs, n = g.mention(rec, o, rng), g.spoken(rec, v, rng), rng.choice(g.noun)
    lines = [f"{om} cannot be right, since {rng.choice(REASONS)}. The {n} is {vs}.",
             f"The {n} is not {om}; it is {vs}.",
             f"The {n} is {vs} rather than {om}.",
             f"{om} is wrong: {rng.choice(REASONS)}. So the {n} is {vs}.",
             f"The {n} is {vs}, not {om}.",
             f"It isn't {om}, because {rng.choice(REASONS)}.\n{rng.choice(g.markers)}: {g.short(rec, v, rng)}",
             f"{om} is ruled out ({rng.choice(REASONS)}), which leaves {vs} as the {n}."]
    if _bare_value_reads(g):
        lines.append(f"I'd choose {vs} rather than {om}.")
    line = rng.choice(lines)
    return _reply(g.working(rec, rng), line[:1].upper() + line[1:]), g.expected(rec, v)


def form_hedge(g, rec, rng):
    v = g.target(rec, rng)
    o = g.other(rec, v, rng)
    vs, n = g.spoken(rec, v, rng), rng.choice(g.noun)
    lines = [f"I think the {n} is probably {vs}, though I'm not completely sure.",
             f"Tentatively, the {n} is {vs}.",
             f"The {n} is most likely {vs}, though {g.mention(rec, o, rng)} deserves a second look."]
    if _bare_value_reads(g):
        lines += [f"It might be {g.mention(rec, o, rng)}, but on balance I'd say {vs}.", f"Probably {vs}.",
                  f"My best guess: {vs}.", f"I'm fairly sure it's {vs}, although {g.mention(rec, o, rng)} is close."]
    line = rng.choice(lines)
    return _reply(g.working(rec, rng), line), g.expected(rec, v)


def form_correction(g, rec, rng):
    """An earlier conclusion (often boxed), then a correction: the later one counts."""
    v = g.target(rec, rng)
    o = g.other(rec, v, rng)
    n = rng.choice(g.noun)
    earlier = [_marker(g, rec, o, rng), f"So the {n} is {g.spoken(rec, o, rng)}."]
    if g.kind not in ("score", "confidence", "verdict"):
        earlier.append(f"\\boxed{{{g.short(rec, o, rng)}}}")
    oops = rng.choice(["Wait, I made an error in the second step.", "Hold on — I misread the question.",
                       "Actually, that's wrong: I dropped a condition.", "Let me re-check... I made a mistake above."])
    later = rng.choice([f"So the {n} is {g.spoken(rec, v, rng)}.", _marker(g, rec, v, rng),
                        f"The corrected {n.replace('correct ', '')} is **{g.short(rec, v, rng)}**."])
    return (_reply(g.working(rec, rng), rng.choice(earlier), f"{oops} {arithmetic(rng, 1)[0]}\n{later}"),
            g.expected(rec, v))


def form_nbsp(g, rec, rng):
    v = g.target(rec, rng)
    line = rng.choice([f"{rng.choice(g.markers)}:{NBSP}{g.short(rec, v, rng)}",
                       f"The {rng.choice(g.noun)} is{NBSP}{g.spoken(rec, v, rng)}.",
                       f"{rng.choice(g.markers)}{NBSP}:{NBSP}{g.short(rec, v, rng)}"])
    return _reply(g.working(rec, rng), line), g.expected(rec, v)


def form_long_working(g, rec, rng):
    v = g.target(rec, rng)
    parts = []
    while sum(len(p.split()) for p in parts) < rng.randint(220, 420):
        parts.append(g.working(rec, rng))
        parts.append(" ".join(arithmetic(rng, rng.randint(2, 5))))
        o = g.other(rec, v, rng)
        parts.append(f"Could it be {g.mention(rec, o, rng)}? {rng.choice(NEUTRAL).capitalize()}.")
    return _reply(*parts, _conclude(g, rec, v, rng)), g.expected(rec, v)


def form_ambiguous(g, rec, rng):
    v = g.target(rec, rng)
    a, b = (v, g.other(rec, v, rng))[::rng.choice((1, -1))]
    n = rng.choice(g.noun)
    lines = [f"The {n} is {g.spoken(rec, a, rng)} or {g.spoken(rec, b, rng)}.",
             f"{rng.choice(g.markers)}: {g.short(rec, a, rng)} or {g.short(rec, b, rng)}",
             f"So the {n} is either {g.spoken(rec, a, rng)} or {g.spoken(rec, b, rng)}, depending on how the question "
             f"is read."]
    if _bare_value_reads(g):
        lines += [f"It's either {g.spoken(rec, a, rng)} or {g.spoken(rec, b, rng)}; I can't rule out either.",
                  f"I'm torn between {g.spoken(rec, a, rng)} and {g.spoken(rec, b, rng)}, and both seem defensible."]
    line = rng.choice(lines)
    return _reply(g.working(rec, rng), line), AMBIGUOUS


def form_committed_then_ambiguous(g, rec, rng):
    """An early commitment, then a closing that commits to two: the end decides."""
    v = g.target(rec, rng)
    o = g.other(rec, v, rng)
    n = rng.choice(g.noun)
    return _reply(g.working(rec, rng), _marker(g, rec, v, rng),
                  f"On reflection, the {n} could just as well be {g.spoken(rec, o, rng)}: "
                  f"{g.spoken(rec, v, rng)} or {g.spoken(rec, o, rng)}, I cannot decide."), AMBIGUOUS


def form_cut_off(g, rec, rng):
    text = g.working(rec, rng)
    if g.name == "confidence":  # its working ends in the answer line, which is not a confidence
        text = text.rsplit("\n", 1)[0]
    words = text.split(" ")
    cut = " ".join(words[:max(4, int(len(words) * rng.uniform(0.5, 0.95)))])
    tail = rng.choice([" and then", " so the", ", which means", " Comparing this with", " Next we"])
    return cut.rstrip(".") + tail, UNREAD


def form_undecided(g, rec, rng):
    text = g.working(rec, rng)
    return _reply(text, rng.choice(["I can't determine this from the information given.",
                                    "I need more information before I can decide.",
                                    "Let me think about this more carefully before committing.",
                                    "There is not enough here to settle it."])), UNREAD


GENERIC = (form_answer_is, form_marker_colon, form_marker_bold, form_marker_dash, form_marker_brackets, form_heading,
           form_bullets, form_textbf, form_go_with, form_closing_line, form_names_others, form_refutation, form_hedge,
           form_correction, form_nbsp, form_long_working, form_ambiguous, form_committed_then_ambiguous,
           form_cut_off, form_undecided)


# Group-specific forms.

def form_option_with_text(g, rec, rng):
    v = g.target(rec, rng)
    line = fill(rng.choice(["{M}: ({v}) {t}", "The {n} is ({v}) {t}.", "**{M}: {v}) {t}**", "So the {n} is {v}: {t}"]),
                M=rng.choice(g.markers), n=rng.choice(g.noun), v=v, t=g.option_text(rec, v))
    return _reply(g.working(rec, rng), line), v


def form_lowercase_letter(g, rec, rng):
    v = g.target(rec, rng)
    line = fill(rng.choice(["the answer is ({v}).", "answer: ({v})", "So the correct option is ({v})."]), v=v.lower())
    return _reply(g.working(rec, rng), line), v


def form_quoted_text(g, rec, rng):
    v = g.target(rec, rng)
    t = g.option_text(rec, v)
    line = rng.choice([f"The answer is the option “{t}”.", f"Answer: \"{t}\"", f"I'd go with '{t}'."])
    return _reply(g.working(rec, rng), line), v


def _pick_where(g, rng, fits, rec):
    """A record whose gold fits a form (a negative number, a fraction), or `rec` when the data has none."""
    fitting = [r for name in sorted(g.sources) for r in g.sources[name] if fits(r.gold)]
    return rng.choice(fitting) if fitting else rec


def form_thousands(g, rec, rng):
    rec = _pick_where(g, rng, lambda gold: abs(Fraction(gold)) >= 1000, rec)
    v = g.target(rec, rng)
    if abs(Fraction(v)) < 1000:
        return form_marker_colon(g, rec, rng)
    s = _thousands(v, rng.choice([",", ",", NBSP, "\u202f"]))
    return _reply(g.working(rec, rng), fill(rng.choice(["The answer is {s}.", "Answer: {s}", "**Answer:** {s}"]), s=s)), v


def form_fullwidth(g, rec, rng):
    v = g.target(rec, rng)
    s = _fullwidth(v)
    return _reply(g.working(rec, rng), fill(rng.choice(["The answer is {s}.", "Answer: {s}", "答え: {s}\nAnswer: {s}"]),
                                            s=s)), v


def form_unicode_minus(g, rec, rng):
    rec = _pick_where(g, rng, lambda gold: gold.startswith("-") if g.kind == "number" else
                      "-" in gold and "\\text" not in gold, rec)
    v = g.target(rec, rng)
    s = v.replace("-", MINUS)
    line = fill(rng.choice(["The answer is {s}.", "Answer: {s}", "So the result is {s}.", "Answer: ${s}$"]), s=s)
    return _reply(g.working(rec, rng), line), v


def form_currency(g, rec, rng):
    v = g.target(rec, rng)
    if v.startswith("-"):
        return form_answer_is(g, rec, rng)
    s = rng.choice([f"${_thousands(v)}", f"${v}", f"{v} dollars", f"${_thousands(v)}.00" if "." not in v else f"${v}"])
    return _reply(g.working(rec, rng), fill(rng.choice(["The answer is {s}.", "Answer: {s}", "In total: {s}."]), s=s)), v


def form_math_boxed(g, rec, rng):
    v = g.target(rec, rng)
    line = rng.choice([f"\\boxed{{{v}}}", f"$\\boxed{{{v}}}$", f"\\[\\boxed{{{v}}}\\]", f"The answer is $\\boxed{{{v}}}$."])
    return _reply(g.working(rec, rng), line), v


def form_dfrac(g, rec, rng):
    rec = _pick_where(g, rng, lambda gold: "\\frac" in gold, rec)
    v = g.target(rec, rng)
    written = v.replace("\\frac", rng.choice(["\\dfrac", "\\tfrac"])) if "\\frac" in v else v
    line = rng.choice([f"The answer is ${written}$.", f"\\boxed{{{written}}}", f"Answer: ${written}$"])
    return _reply(g.working(rec, rng), line), v


def form_slash_fraction(g, rec, rng):
    rec = _pick_where(g, rng, lambda gold: re.fullmatch(r"-?\\frac\{\d+\}\{\d+\}", gold.replace(" ", "")), rec)
    v = g.target(rec, rng)
    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", v.replace(" ", ""))
    written = f"{m.group(1)}{m.group(2)}/{m.group(3)}" if m else v
    return _reply(g.working(rec, rng), rng.choice([f"The answer is {written}.", f"Answer: {written}"])), v


def form_display_math(g, rec, rng):
    v = g.target(rec, rng)
    line = rng.choice([f"The answer is\n$$\n{v}\n$$", f"Therefore\n\\[\n{v}\n\\]", f"Final answer:\n$${v}$$"])
    return _reply(g.working(rec, rng), line), v


def form_negation(g, rec, rng):
    v = g.target(rec, rng)
    o = g.short(rec, g.other(rec, v, rng), rng)
    line = rng.choice([f"The answer is not {o}.", f"So, not {o}: the answer is {g.short(rec, v, rng)}.",
                       f"Answer: not {o}", f"{o.capitalize()} would be wrong here."])
    return _reply(g.working(rec, rng), line), v


def form_true_false(g, rec, rng):
    v = g.target(rec, rng)
    word = rng.choice({"yes": ["True", "true"], "no": ["False", "false"]}[v])
    return _reply(g.working(rec, rng), rng.choice([f"Answer: {word}", f"The statement is {word}.", f"**{word}**"])), v


def form_entailment_sentence(g, rec, rng):
    v = g.target(rec, rng)
    s = g.sentence(rec, v, rng)
    return _reply(g.working(rec, rng), rng.choice([f"Therefore, {s}.", s[0].upper() + s[1:] + ".",
                                                   f"In short: {s}."])), v


def form_entailment_negation(g, rec, rng):
    v = g.target(rec, rng)
    line = {"yes": ["It is not the case that the hypothesis fails to follow; it is entailed by the premise.",
                    "This is not a contradiction: the hypothesis is entailed by the premise.",
                    "The answer is not \"not entailment\": the premise entails the hypothesis."],
            "no": ["The answer is not entailment.", "This does not follow from the premise.",
                   "The premise does not support the hypothesis, so it is not entailed.",
                   "Answer: no, the hypothesis is not entailed."]}[v]
    return _reply(g.working(rec, rng), rng.choice(line)), v


def form_verdict_sentence(g, rec, rng):
    v = g.target(rec, rng)
    s = g.sentence(rec, v, rng)
    return _reply(g.working(rec, rng), rng.choice([f"Overall, {s}.", s[0].upper() + s[1:] + ".", f"My judgement: {s}."])), v


def form_verdict_not(g, rec, rng):
    v = g.target(rec, rng)
    o = g.other(rec, v, rng)
    not_o = {"win": "Assistant 1 is not better", "lose": "Assistant 2 is not better", "tie": "It is not a tie"}[o]
    return _reply(g.working(rec, rng), f"{not_o}. Verdict: {g.short(rec, v, rng)}"), v


def form_ratio(g, rec, rng):
    v = rng.choice([x for x in SCORE_GRID if (x * 10).denominator == 1])
    line = rng.choice([f"Score: {v * 10}/10", f"I give it {v * 10}/10.", f"Score: {v * 10} out of 10",
                       f"**Score:** {v * 10}/10"])
    return _reply(g.working(rec, rng), line), float(v)


def form_percent(g, rec, rng):
    v = rng.choice(SCORE_GRID)
    line = rng.choice([f"Score: {v * 100}%", f"I'd score it {v * 100}%.", f"Score: {v * 100} %"])
    return _reply(g.working(rec, rng), line), float(v)


def form_score_of(g, rec, rng):
    v = g.target(rec, rng)
    line = rng.choice([f"I give it a score of {_decimal(v)}.", f"This earns a score of {_decimal(v)}.",
                       f"A score of {_decimal(v)} fits."])
    return _reply(g.working(rec, rng), line), float(v)


def form_rate_it(g, rec, rng):
    v = g.target(rec, rng)
    line = rng.choice([f"I rate it {_decimal(v)}.", f"I'd rate this answer {_decimal(v)}.", f"I rate it at {_decimal(v)}."])
    return _reply(g.working(rec, rng), line), float(v)


def form_bare_score(g, rec, rng):
    v = g.target(rec, rng)
    return _decimal(v) + rng.choice(["", "\n", "."]), float(v)


def form_percent_confident(g, rec, rng):
    v = g.target(rec, rng)
    line = rng.choice([f"I am {v * 100}% confident.", f"I'm about {v * 100}% confident in this.",
                       f"I am {v * 100}% confident in this answer.", f"Confidence: {v * 100}%"])
    return _reply(g.working(rec, rng), line), float(v)


def form_confidence_first(g, rec, rng):
    v = g.target(rec, rng)
    head = g.working(rec, rng).rsplit("\n", 1)
    return _reply(head[0], f"Confidence: {_decimal(v)}", head[1]), float(v)


def form_confidence_not(g, rec, rng):
    v = g.target(rec, rng)
    o = g.other(rec, v, rng)
    line = rng.choice([f"I am not {o * 100}% confident; more like {v * 100}%.",
                       f"Not {_decimal(o)} — Confidence: {_decimal(v)}",
                       f"Confidence: {_decimal(v)} (not {_decimal(o)})"])
    return _reply(g.working(rec, rng), line), float(v)


def form_no_number(g, rec, rng):
    return _reply(g.working(rec, rng), rng.choice(["I am fairly confident in this.", "I'm quite sure about it.",
                                                   "Confidence: high", "I feel reasonably confident."])), UNREAD


LETTER_FORMS = GENERIC + (form_boxed, form_option_with_text, form_lowercase_letter)
GROUPS = {
    "letter": (LetterGroup, choice_records, LETTER_FORMS),
    "option_text": (OptionTextGroup, choice_records, tuple(f for f in GENERIC if f is not form_marker_brackets)
                    + (form_quoted_text,)),
    "number": (NumberGroup, number_records, GENERIC + (form_boxed, form_thousands, form_fullwidth, form_unicode_minus,
                                                       form_currency)),
    "math": (MathGroup, math_records, tuple(f for f in GENERIC if f is not form_marker_brackets)
             + (form_math_boxed, form_dfrac, form_slash_fraction, form_display_math, form_unicode_minus)),
    "yesno": (YesNoGroup, boolq_records, GENERIC + (form_boxed, form_negation, form_true_false)),
    "entailment": (EntailmentGroup, rte_records, GENERIC + (form_entailment_sentence, form_entailment_negation)),
    "verdict": (VerdictGroup, faireval_records, tuple(f for f in GENERIC if f is not form_go_with)
                + (form_verdict_sentence, form_verdict_not)),
    "score": (ScoreGroup, number_records, tuple(f for f in GENERIC if f is not form_go_with) + (form_ratio, form_percent, form_score_of, form_rate_it,
                                                     form_bare_score)),
    "confidence": (ConfidenceGroup, number_records,
                   tuple(f for f in GENERIC if f not in (form_go_with, form_closing_line, form_textbf))
                   + (form_percent_confident, form_confidence_first, form_confidence_not, form_no_number)),
}


def _form_name(form):
    return form.__name__.removeprefix("form_").replace("_", "-")


def categories(group):
    return [f"{group}/{_form_name(f)}" for f in GROUPS[group][2]]


def corpus(per_group=PER_GROUP, seed=0, data_dir=DATA_DIR):
    """per_group items for every group, the forms taken in turn (each form about equally often)."""
    items = []
    for name, (cls, load, forms) in GROUPS.items():
        g = cls(load(data_dir))
        rng = random.Random(f"{seed}:{name}")
        for i in range(per_group):
            form = forms[i % len(forms)]
            rec = g.pick(rng)
            text, expected = form(g, rec, rng)
            items.append(Item(g.kind, text, g.choices(rec), expected, f"{name}/{_form_name(form)}"))
    return items


def sample(per_group=40, seed=0, data_dir=DATA_DIR):
    """A fixed random subset of the full corpus: per_group items of every group."""
    rng = random.Random(seed)
    by_group = {}
    for item in corpus(data_dir=data_dir):
        by_group.setdefault(item.group, []).append(item)
    return [item for name in GROUPS for item in rng.sample(by_group[name], per_group)]


# ------------------------------------------------------------------------------------------------ judging

OUTCOMES = ("right", "wrong value", "unread when committed", "ambiguous when committed", "read when ambiguous",
            "unread when ambiguous", "read when unread", "ambiguous when unread")


def judge(item, status, value):
    """How a reader's (status, value) compares with the grader's reading: "right" or one of OUTCOMES."""
    if item.expected == AMBIGUOUS:
        return {"ambiguous": "right", "read": "read when ambiguous"}.get(status, "unread when ambiguous")
    if item.expected == UNREAD:
        return {"unread": "right", "read": "read when unread"}.get(status, "ambiguous when unread")
    if status != "read":
        return "ambiguous when committed" if status == "ambiguous" else "unread when committed"
    return "right" if same_value(item, value) else "wrong value"


def same_value(item, value):
    if value is None:
        return False
    if item.kind in ("number", "math"):
        from byzantium.tasks.answers import is_correct
        return bool(is_correct(value, item.expected, item.kind))
    if item.kind in ("score", "confidence"):
        return abs(float(value) - item.expected) <= 1e-9
    return value == item.expected
