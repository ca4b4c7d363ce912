"""What each answer kind's values look like, for the conclusion reader (conclusion.py).

A kind says how to find its values in a piece of text (`find`, with their spans) and when two values
are the same (`same`); the defaults below cover the rest: which statements commit (`markers`,
`statements`), what is emphasised (\\boxed{}, **bold**, \\textbf{}), whether a reply's opening word
or closing line can be its answer.
"""

import re
from collections import deque
from fractions import Fraction

from .choice import option_value, same_value
from .conclusion import ANSWER_MARKERS, CHOOSING_MARKERS, LAST, REVISING_MARKERS, Found, found_in, no_overlaps, plain
from .math_equal import math_equal
from .math_form import strip_math
from .reading import normalize_text

# \mathbf is a vector's name, not emphasis
_BOLD = re.compile(r"\*\*([^*\n]{1,80})\*\*|__([^_\n]{1,80})__|\\(?:textbf|bf)\{([^{}\n]{1,80})\}")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*")


def braced(text, i, limit=2000):
    """(content, end) of the brace group opening at text[i] == "{", or None when it is not closed within
    `limit` characters (no answer is longer; an unclosed run of "\\boxed{" stays linear)."""
    depth = 0
    for k in range(i, min(len(text), i + limit)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[i + 1:k], k + 1
    return None


def boxes(text):
    """[(start, content)] of every \\boxed{...} / \\fbox{...} (nested braces allowed), and "\\boxed 5"."""
    out, inside_until = [], -1
    for m in deque(_BOX.finditer(text), maxlen=LAST):  # the last boxes: an answer is boxed at the end
        if m.start() < inside_until:
            continue  # a box inside a box is part of its answer
        if text.startswith("{", m.end()):
            got = braced(text, m.end())
            if got:
                out.append((m.start(), got[0]))
                inside_until = got[1]
        else:
            b = re.match(r"([^\s$]+)", text[m.end():])
            if b:
                out.append((m.start(), b.group(1)))
    return out


class Values:
    """The defaults every kind shares."""
    markers = ANSWER_MARKERS
    binary = False  # two values only: ruling one out commits to the other
    bare_line = True  # a closing line that is only a value commits to it
    discrete = True  # values are tokens found anywhere (letters, numbers), not whole phrases

    def bare(self, line):
        """May this closing line be only a value? (phrases need a stricter look)"""
        return True

    def find(self, text):
        raise NotImplementedError

    def same(self, a, b):
        return a == b

    def complement(self, value):
        return None

    def focus(self, piece, weak=False):
        """The part of a committing piece that states the value."""
        return piece

    def boxed_list(self, inner):
        """What a box whose content joins values with "or" states (None: it is ambiguous)."""
        return None

    def emphasised(self, text):
        out = boxes(text)
        out += [(m.start(), next(g for g in m.groups() if g is not None)) for m in _BOLD.finditer(text)]
        return out

    def statements(self, text):
        """[(position, piece)] of statements that commit without a marker (kind-specific)."""
        return []

    def opening(self, text):
        return None


# ------------------------------------------------------------------ option letters


class ChoiceValues(Values):
    """An option by its letter ("(C)", "[C]", "C"), its text ("a marsh") or its value ("Rs. 250")."""

    def __init__(self, letters, choices=None):
        self.letters, self.choices = letters, [plain(str(c)) for c in choices or []]  # read as the reply is
        self.values = [option_value(c) for c in self.choices]

    def find(self, text):
        found = found_in(rf"(?<![\w'\\-])[(\[]?([{self.letters}])(?:[)\]]|(?![\w'-]))", text, self._letter)
        found += found_in(rf"(?<![\w'\\-])\(([{self.letters.lower()}])\)", text, lambda m: m.group(1).upper())
        by_span = {}
        for i, choice in enumerate(self.choices):
            words = str(choice).strip().rstrip(".?!").strip()
            if not words or words in self.letters:
                continue  # an option whose text is a letter is named by its letter
            pattern = r"(?<!\w)" + r"\s+".join(map(re.escape, words.split())) + r"(?!\w)"
            for m in re.finditer(pattern, text, re.I):
                by_span.setdefault((m.start(), m.end()), []).append((m.group() == words, self.letters[i]))
        for (start, end), hits in by_span.items():
            exact = [letter for same_case, letter in hits if same_case]
            named = exact if len(exact) == 1 else [letter for _, letter in hits]
            # two options with the same text: the reply names neither ("8.75" among 8.75, 8.79, 8.75)
            found.append(Found(start, end, named[0] if len(set(named)) == 1 else None))
        if any(self.values):
            number = r"(?:rs\.?\s*|\$\s*|€|£|₹)?-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?(?:\s*[a-z%]+(?:/[a-z]+)?)?"
            found += found_in(number, text, self._by_value, re.I)
        return [f for f in no_overlaps(found) if f.value is not None]

    def _letter(self, m):
        after = m.string[m.end():m.end() + 12]
        if m.group() in ("A", "I") and re.match(r" (?!or\b|and\b|is\b|was\b|because\b|since\b|as\b|seems\b|rather\b|instead\b|over\b|here\b|then\b|with\b"
                                                             r"|must\b|would\b|could\b|can|fails\b|too\b|not\b|only\b)[a-z]", after):
            return None  # "A cat", "I think": an article or a pronoun, not an option
        return m.group(1)

    def _by_value(self, m):
        value = option_value(m.group())
        hits = [i for i, v in enumerate(self.values) if v and value and same_value(v, value)]
        return self.letters[hits[0]] if len(hits) == 1 else None

    def opening(self, text):
        # "B. Because ...", "(C)": a reply that opens with its letter; "(A) and (D) are both ..." opens with none
        m = re.match(rf"[\s*#_]*[(\[]?([{self.letters}])(?:[)\]]|[.:](?!\d)|\s*$)(?![*_\s]*(?:and|or|,|/|\())", text)
        return m.group(1) if m else None


# ------------------------------------------------------------------ numbers

_NUMBER = r"(?<![\w.,/])[-+]?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?![\d.]))?%?|(?<![\w.])-?\.\d+%?"
_EXPRESSION = re.compile(r"^\s*[-+]?\$?\d[\d,.]*\s*(?:\\times|\\cdot|[*×+÷^]|\s-\s)\s*-?\$?\d")


def _number_value(m):
    """The number as written, commas and currency dropped, a letter stuck to it kept ("2k" is not 2)."""
    s = re.sub(r"[$,\s]", "", m.group()).lstrip("+")
    letter = re.match(r"[a-zA-Z](?![a-zA-Z])", m.string[m.end():])
    return s + letter.group() if letter and letter.group() not in "mshglMSHGL" else s


def _fraction(s):
    s = str(s).rstrip("%")
    try:
        if "/" in s:
            a, b = s.split("/")
            return Fraction(a) / Fraction(b)
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


class NumberValues(Values):
    """A number: "1,300", "-5", "$12.50", "3/4", "\\frac{3}{4}", "25%"; an expression ("30 \\times 2")
    states none until it is evaluated ("= 60")."""

    def find(self, text):
        text = re.sub(r"\\d?frac\{(-?\d+)\}\{(\d+)\}", lambda m: f"{m.group(1)}/{m.group(2)}".ljust(len(m.group())), text)
        return found_in(_NUMBER, text, _number_value)

    def same(self, a, b):
        fa, fb = _fraction(a), _fraction(b)
        if fa is None or fb is None or a.endswith("%") != b.endswith("%"):
            return a == b
        return fa == fb

    def focus(self, piece, weak=False):
        piece = piece.split("=")[-1]
        return "" if _EXPRESSION.match(piece.lstrip(" :*_-")) else piece


# ------------------------------------------------------------------ maths and free text

_MATH_SPAN = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|(?<!\\)\$((?:\\\$|[^$])+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_FILLER = re.compile(r"^(?:[\s*_:]|\b(?:it\s+is|it's|actually|really|simply|just|then|the\s+answer\s+is|equal\s+to|"
                     r"most\s+likely|probably|likely|clearly|about|approximately|roughly|around)\b|≈)+", re.I)
_SPLIT = re.compile(r";|,\s*(?=not\b|but\b|it\s+is\b|it's\b|and\b)|\s+(?=(?:or|and|not|but|rather\s+than|instead\s+of)\s)"
                    r"|\b(?:or|and|not|but|rather\s+than|instead\s+of)\s+", re.I)


def _unwrapped(value):
    """\\textbf{x} / \\mathbf{x} / \\boxed{x} around a whole value is emphasis, not part of it."""
    m = re.fullmatch(r"\\(?:textbf|mathbf|boxed|bf)\s*(\{.*\})", value, re.S)
    got = braced(m.group(1), 0) if m else None
    return got[0].strip() if got and got[1] == len(m.group(1)) else value


_JUDGEMENTS = {"correct", "right", "wrong", "incorrect", "valid", "invalid", "true", "false", "verified", "confirmed",
               "unknown", "unclear", "undetermined"}


_MARKER_WORDS = r"(?:final |correct )?(?:answer|solution|result|verdict|choice|option|label)s?"
_FUNCTION_WORDS = {"", "the", "a", "an", "it", "this", "that", "we", "so", "then", "and", "or", "is", "be", "next", "here"}


class ExpressionValues(Values):
    """A whole expression or phrase: each $...$ span, else each part of the piece between connectives
    ("not X; it is Y", "X or Y"), trimmed."""
    words_allowed = 8
    discrete = False

    def bare(self, line):
        # a closing line of maths: a $...$ span, or no word of three letters outside LaTeX commands
        commands = re.sub(r"\\[a-zA-Z]+(?:\{[a-zA-Z*]+\})?", " ", line)
        return bool(_MATH_SPAN.fullmatch(line)) or not re.search(r"[A-Za-z]{3,}", commands)

    def find(self, text):
        spans = [(m.start(), m.end(), next(g for g in m.groups() if g is not None)) for m in _MATH_SPAN.finditer(text)]
        found = [Found(s, e, _unwrapped(v.strip().rstrip(".,;:").strip())) for s, e, v in spans if v.strip()]
        # the text between spans: "The answer is 7, not $94$", "torn between \(9\) and 92"
        gaps, i = [], 0
        for s_, e, _ in spans + [(len(text), len(text), None)]:
            gaps.append((i, s_))
            i = e
        for a, b in gaps:
            found += [f for f in self._parts(text, a, b) if not spans or re.search(r"[\d\\]", f.value)]
        return sorted(found, key=lambda f: f.start)

    def _parts(self, text, a, b):
        """The pieces of text[a:b] between connectives ("not X; it is Y", "X or Y"), trimmed."""
        out, i = [], a
        for m in list(_SPLIT.finditer(text, a, b)) + [None]:
            j = m.start() if m else b
            part = text[i:j]
            lead = _FILLER.match(part)
            start = i + (lead.end() if lead else 0)
            value = _unwrapped(text[start:j].strip().strip("*_").strip().rstrip(".,:").strip())
            if value and self._plausible(value):
                out.append(Found(start, start + len(value), value))
            i = m.end() if m else j
        return out

    def _plausible(self, value):
        said = normalize_text(value)
        if said in _JUDGEMENTS or said in _FUNCTION_WORDS or re.fullmatch(_MARKER_WORDS, said):
            return False  # "so our answer is correct", "so the", "**Final answer**" name no answer
        return len(re.findall(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}", value)) <= self.words_allowed

    def same(self, a, b):
        return normalize_text(a) == normalize_text(b)


_PROSE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}(?:\s+[a-zA-Z]{2,}){1,}")
_QUANTITY = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:\s*/\s*\d+)?\s*%?")


class MathValues(ExpressionValues):
    words_allowed = 2  # "\\text{Evelyn}", "Monday", "east wing": MATH's word answers are short

    def focus(self, piece, weak=False):
        # "So, her average speed is 2d/(4d/3) = 3/2 m/s": a concluding sentence of prose states what
        # follows its last "=", or its one quantity ("So, there is 48% milk left")
        if not weak or _MATH_SPAN.search(piece) or not _PROSE.search(piece):
            return piece
        piece = piece.split("=")[-1]
        if _PROSE.search(piece):
            quantities = _QUANTITY.findall(piece)
            return quantities[0] if len(quantities) == 1 else ""
        return piece

    def boxed_list(self, inner):
        return inner  # \boxed{-1 \text{ or } 3}: a boxed answer joining values is one answer, all its roots

    def same(self, a, b):
        # is_correct's maths test, without its kind dispatch (the package imports this module)
        return a == b or math_equal(strip_math(a), strip_math(b))


class TextValues(ExpressionValues):
    bare_line = False


# ------------------------------------------------------------------ yes / no, entailment

_YES = r"yes|true|correct|entail(?:s|ed|ment)?|follow(?:s|ed)?|implied|supported"
_NO = r"(?:not|no|non)[_ -]?entailment|no|false|incorrect|contradict(?:s|ion|ed)?|neutral"


class BoolValues(Values):
    """yes / no, and entailment as a yes ("the hypothesis is entailed by the premise")."""
    binary = True

    def find(self, text):
        return found_in(rf"(?<![\w-])(?:{_NO}|{_YES})(?![\w-])", text,
                        lambda m: "no" if re.fullmatch(_NO, m.group(), re.I) else "yes", re.I)

    def complement(self, value):
        return {"yes": "no", "no": "yes"}[value]

    def statements(self, text):
        # "The hypothesis is entailed by the premise", "It does not follow": the verdict is the sentence.
        said = r"\b(?:entail(?:s|ed|ment)?|follow(?:s|ed)?|implied|contradict(?:s|ed)?)\b"
        # "That is not true.", "The statement is false."
        plain = r"\b(?:it|that|this|the\s+(?:statement|claim|answer|hypothesis|premise))\s+is\s+(?:not\s+)?(?:true|false)\b"
        return [(m.start(), m.group()) for m in re.finditer(rf"[^.!?\n]{{0,200}}(?:{said}|{plain})[^.!?\n]{{0,200}}(?![?\w])", text, re.I)]

    def opening(self, text):
        m = re.match(r"[\s*#_]*(yes|no|true|false)\b", text, re.I)
        return ("no" if m.group(1).lower() in ("no", "false") else "yes") if m else None


# ------------------------------------------------------------------ pairwise verdicts

_WHO = r"(?:assistant|answer|response|output|model)"
_VERDICT_MARKERS = [(r"\b(?:final\s+)?(?:verdict|decision|judge?ment|winner|conclusion|final\s+answer)\b"
                     r"[*_\s]*(?:is\b|:|=|-)?\s*", False),
                    (r"\bthe\s+better\s+(?:assistant|answer|response|one)(?:\s+is)?\b\s*:?", False)]
_SIDE = [("tie", r"\b(?:tie|tied|draw|equal|equally)\b"),
         ("win", rf"\b{_WHO}\s*(?:1|one|a)\b|\bfirst\b|\[\[\s*(?:a|1)\s*\]\]|^\W*(?:1|a)\W*$"),
         ("lose", rf"\b{_WHO}\s*(?:2|two|b)\b|\bsecond\b|\[\[\s*(?:b|2)\s*\]\]|^\W*(?:2|b)\W*$"),
         ("tie", r"\[\[\s*(?:c|tie)\s*\]\]")]


class VerdictValues(Values):
    """A pairwise judgement: "win" (Assistant 1 is better), "lose" (Assistant 2), "tie". Not "answer is":
    "Assistant 1's answer is better than Assistant 2's" is a comparison, read as one below."""
    markers = _VERDICT_MARKERS + CHOOSING_MARKERS

    def find(self, text):
        found = []
        for value, pattern in _SIDE:
            found += [Found(m.start(), m.end(), value) for m in re.finditer(pattern, text, re.I)]
        return no_overlaps(found)

    def emphasised(self, text):
        out = super().emphasised(text)
        return out + [(m.start(), m.group()) for m in re.finditer(r"\[\[\s*(?:[abc12]|tie)\s*\]\]", text, re.I)]

    def statements(self, text):
        out = []
        # "Assistant 2 is better", "Assistant 1 is worse than Assistant 2": the better one, said plainly.
        who = rf"(?:{_WHO}\s*(1|2|one|two|a|b)\b|\b(?:the\s+)?(first|second)\s+(?:{_WHO}|one)\b)"
        for m in re.finditer(rf"{who}(?:(?!{who})[^.\n]){{0,60}}?"
                             r"\b(?:is|was|does|did|performs?|performed|gave|gives|provided|provides|wrote|writes|has|had)\s+"
                             r"(not\s+)?(?:\w+\s+){0,2}?(better|superior|preferable|preferred|the\s+winner|worse|inferior|weaker)\b",
                             text, re.I):
            first = (m.group(1) or m.group(2)).lower() in ("1", "one", "a", "first")
            better = m.group(6).lower() not in ("worse", "inferior", "weaker")
            won = first == (better != bool(m.group(5)))
            out.append((m.start(), "Assistant 1" if won else "Assistant 2"))
        out += [(m.start(), "Assistant 1" if (m.group(1) or m.group(2)).lower() in ("1", "one", "a", "first") else "Assistant 2")
                for m in re.finditer(rf"{who}\s+(?:clearly\s+|narrowly\s+)?(?:wins|won|is\s+the\s+winner)\b", text, re.I)]
        # "it is a tie", "they did equally well": the sentence, so "rather than a tie" stays a refutation
        for m in re.finditer(r"\b(?:it(?:'s|\s+is)|(?:this|that)\s+is)\s+a\s+tie\b|(?:are|performed|did)\s+equally\s+"
                             r"(?:well|good|helpful)|neither\s+(?:\w+\s+)?is\s+better", text, re.I):
            start = max([text.rfind(ch, max(0, m.start() - 200), m.start()) for ch in ".!?\n"] + [m.start() - 200]) + 1
            out.append((start, text[start:m.end()] + ("" if "neither" not in m.group().lower() else " tie")))
        return out

    def opening(self, text):
        # FairEval's format: the first line holds the two scores ("8 7": the higher wins).
        first = text.strip().split("\n")[0] if text.strip() else ""
        m = re.fullmatch(r"\W*(\d+(?:\.\d+)?)(?:\s*/\s*10)?\s*[,\s]\s*(\d+(?:\.\d+)?)(?:\s*/\s*10)?\W*", first)
        if not m:
            return None
        a, b = float(m.group(1)), float(m.group(2))
        return "win" if a > b else "lose" if a < b else "tie"


# ------------------------------------------------------------------ judge scores and confidences

# "7/10", "3 out of 4", "85%"; "7 out of" cut off before its scale is no value
_RATIO = (r"(?<![\w.])(-?(?:\d+(?:\.\d+)?|\.\d+))(?![\d.])\s*(?:(%)|(?:/|out\s+of)\s*(\d+(?:\.\d+)?))?"
          r"(?!\s*(?:/|out\s+of\b))")


class ScoreValues(Values):
    """A judge's score in [0, 1]: "Score: 0.8", "a score of 0.8", "I rate it 0.7", "7/10", "85%"."""
    markers = [(r"\b(?:score|rating|rated|grade)\b(?:\s*\([^)\n]{0,20}\))?[*_\s]*(?:of\b|is\b|would\s+be\b|:|=|-)?\s*", False),
               (r"\b(?:I(?:'d|\s+would|\s+will)?\s+)?(?:rate|give|score|assign)\s+(?:it|this|the\s+\w+)\s*"
                r"(?:an?\s+|at\s+|as\s+)?(?:score\s+of\s+|rating\s+of\s+)?", False)] + REVISING_MARKERS
    percent_divides = False  # a score above 1 is clipped; a confidence above 1 is a percentage

    def bare(self, line):
        # A closing line that is one score ("0.8", "7/10", "85%"), not a line of the judge's working
        # ("24 * 2 - 28 - 25 * 2", a judge cut off mid-sum, whose last 2 would be clipped to 1.0).
        found = self.find(line)
        return len(found) == 1 and found[0].start == 0 and not line[found[0].end:].strip(" .*_!")

    def find(self, text):
        return found_in(_RATIO, text, self._value, re.I)

    def _value(self, m):
        number, percent, denominator = m.groups()
        if denominator:
            if float(denominator) <= 0:
                return None
            value = float(number) / float(denominator)
        else:
            value = float(number) / 100 if percent or (self.percent_divides and float(number) > 1) else float(number)
        return min(1.0, max(0.0, value))

    def same(self, a, b):
        return abs(a - b) < 1e-9


class ConfidenceValues(ScoreValues):
    """CP-WBFT's reported confidence: "Confidence: 0.9", "Confidence level: 0.8", "I am 90% confident"."""
    markers = [(r"\bconfidence(?:\s+(?:score|level|value|rating|estimate))?(?:\s*\([^)\n]{0,20}\))?[*_\s]*"
                r"(?:of\b|is\b|:|=|-)?\s*", False)] + REVISING_MARKERS
    bare_line = False  # a reply that is only "42" is its answer, not its confidence
    percent_divides = True

    def statements(self, text):
        # "I am 90% confident", and "I am not 45% confident" (its negation read with it)
        return [(m.start(), m.group()) for m in re.finditer(
            r"(?:\bnot\s+)?(?<![\w.])(\d+(?:\.\d+)?[ \t]*%?)[ \t]*(?:confident|sure|certain|confidence)\b", text, re.I)]
