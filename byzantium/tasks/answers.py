"""Answer extraction and THE correctness check: every metric goes through `is_correct`.

    extract_answer(text, kind, choices)  model output -> the answer it states (or None)
    normalize_answer(answer, kind)       answer -> canonical string, equal for equivalent answers
                                         ("1/2", "\\frac{1}{2}", "0.5" -> "0.5"); used for votes
    is_correct(predicted, gold, kind)    equivalence; canonical equality implies correctness;
                                         `gold` may be a list of accepted answers (CIAR)

Kinds: "number" (GSM8K), "math" (MATH: LaTeX, sympy equivalence), "choice" (a letter),
"bool" (yes/no), "text" (normalised string), "code" (normalised source; execution-based
checking belongs to a sandbox, not here), "verdict" (a pairwise judgement of two assistants:
"win" = Assistant 1 is better, "lose" = Assistant 2 is better, "tie"), "translation" (a sentence;
extracted and normalised here, but scored by BLEU/chrF in `resilience.score_output`, so
`is_correct` refuses it).

Units are dropped from a whitelist ("5 cm", "12 dollars", "1.5 m/s", "60 miles per hour", and MATH's
"5\\text{ cents}"), never "any letters": "2k", "5i", "2x" and "2pi" are other values than 2 and 5. Two
plain decimals compare exactly; a tolerance applies only where one side cannot be written as one
("0.3333333" vs 1/3). Words ("Evelyn") and option labels ("(c)") compare without case.

LaTeX is turned into sympy-parsable text by a small converter (sympy's own LaTeX parser needs
an exact antlr4 runtime version); only whitelisted names reach `parse_expr`, and every sympy call
runs under a time limit so a pathological answer from an adversarial agent cannot hang a run.
"""

import functools
import math
import re
import signal
import string
import threading
from fractions import Fraction

KINDS = ("number", "math", "choice", "bool", "text", "code", "verdict", "translation")
VERDICTS = ("win", "lose", "tie")
LETTERS = "ABCDEFGHIJ"
SYMPY_SECONDS = 2.0
REL_TOL = 1e-6


# ------------------------------------------------------------------------------------- extraction

def extract_answer(text, kind, choices=None):
    """The answer stated in a model's output, as a string, or None when none is found."""
    _check_kind(kind)
    if text is None:
        return None
    text = re.sub(r"<think>.*?</think>", "", str(text), flags=re.S).strip()
    if kind == "code":
        blocks = re.findall(r"```[\w+-]*\n(.*?)```", text, flags=re.S)
        return (blocks[-1] if blocks else text).strip() or None
    if kind == "choice":
        return _extract_choice(text, choices)
    if kind == "bool":
        return _extract_bool(text)
    if kind == "verdict":
        return _extract_verdict(text)
    if kind == "translation":
        return _extract_translation(text)
    cand = last_boxed(text)
    if cand is None:
        cand = _answer_line(text)
    if kind == "number":
        if cand is None:
            m = re.findall(r"####\s*(.+)", text)
            return _number_in(m[-1]) if m else _last_number(text)
        return _number_in(cand)
    if kind == "math":
        if cand is not None:
            m = re.search(r"\$+([^$]+)\$+", cand)
            cand = m.group(1) if m else cand
        else:
            dollars = re.findall(r"\$+([^$]+)\$+", text)
            cand = dollars[-1] if dollars else _last_number(text)
        return _clean(cand) if cand is not None else None
    return _clean(cand) if cand is not None else (text or None)  # text


def last_boxed(text):
    """Content of the last top-level \\boxed{...} (or \\fbox), nested braces allowed; None if absent
    or cut off."""
    found, i = None, 0
    while True:
        m = re.compile(r"\\(?:boxed|fbox)").search(text, i)
        if not m:
            return found
        j = m.end()
        if not text.startswith("{", j):  # "\boxed 5"
            b = re.match(r"\s+([^\s$]+)", text[j:])
            found, i = (b.group(1) if b else found), j
            continue
        depth, end = 0, None
        for k in range(j, len(text)):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                end = k
                break
        if end is None:
            return found
        found, i = text[j + 1:end], end + 1


def _answer_line(text):
    """What follows the last 'answer is' / 'Answer:' marker, up to the end of its sentence."""
    hits = list(re.finditer(r"(?i)\banswer\s*(?:is|:|=)\s*:?", text))
    if not hits:
        return None
    rest = text[hits[-1].end():].split("\n")[0] + " "
    ends = [m.start() for m in re.finditer(r"\.\s", rest) if not _ABBREVIATION.search(rest[:m.start()])]
    return _clean(rest[:ends[0]] if ends else rest) or None


_ABBREVIATION = re.compile(r"\b(?:Mt|Rs|Dr|Mr|Mrs|Ms|St|Jr|Sr|vs|approx|etc|e\.g|i\.e)$")  # "Rs. 750" is one answer


def _clean(s):
    s = s.strip().strip("*").strip()
    s = re.sub(r"^\$+|\$+$", "", s).strip()
    return s.rstrip(".").strip()


_NUM = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+"


def _number_in(s):
    """The number a candidate states: right of its last '=', first number there, commas dropped."""
    if s is None:
        return None
    s = s.split("=")[-1]
    # An expression ("30 \\times 2") is not its first number; unevaluated, it states no number.
    if re.search(r"\d\s*(?:\\times|\\cdot|[*×+])\s*-?\d", s):
        return None
    s = re.sub(r"\\frac\{(-?\d+)\}\{(\d+)\}", r"\1/\2", s)
    m = re.search(rf"({_NUM})(?:\s*/\s*(\d+))?", s)
    if not m:
        return None
    num = m.group(1).replace(",", "")
    num = f"{num}/{m.group(2)}" if m.group(2) else num
    # A letter stuck to it makes another value ("2k", "5i", "2x"), unless it is a unit symbol ("5m").
    letter = re.match(r"[a-zA-Z](?![a-zA-Z])", s[m.end():])
    return num + letter.group() if letter and letter.group() not in "mshglMSHGL" else num


def _last_number(text):
    nums = re.findall(_NUM, text)
    return nums[-1].replace(",", "") if nums else None


def _extract_choice(text, choices):
    letters = LETTERS[:len(choices)] if choices else LETTERS
    for cand in (last_boxed(text), _answer_line(text)):
        if cand is not None:
            got = _letter_in(cand, letters, choices)
            if got:
                return got
    # A stated conclusion beats letters named in the reasoning ("(A) fails. Therefore, B is correct.").
    said = re.findall(rf"(?i)(?:\bfinal\s+(?:choice|option)\s*(?:is\b|:)|\b(?:answer|option|choice)\s+must\s+be)"
                      rf"\s*\**\(?([{letters}])\b|\b(?:option\s+|choice\s+)?\(?([{letters}])\)?\s+is\s+(?:the\s+)?"
                      rf"(?:correct|right)\b(?!\s+(?:only|if))", text)
    if said:
        return next(g for g in said[-1] if g).upper()
    # A line that is only a conclusion ("Answer D", "Ans A", "correct option is C", "A") beats a "(B)" of the
    # working above it ("P(B)"): AQuA's rationales end that way.
    lines = re.findall(rf"(?im)^[\s*]*(?:(?:the\s+)?(?:correct\s+)?(?:answer|ans|option|choice)\s*(?:is\b)?\s*[:.]?\s*)?"
                       rf"\(?([{letters}])\)?[\s.*]*$", text)
    if lines:
        return lines[-1].upper()
    parens = re.findall(rf"\(([{letters}{letters.lower()}])\)", text)
    if parens:
        return parens[-1].upper()
    starts = re.findall(rf"(?m)^\s*\**([{letters}])[.):]", text)
    if starts:
        return starts[-1]
    last_line = text.strip().split("\n")[-1] if text.strip() else ""
    return _letter_in(last_line, letters, choices)


def _letter_in(cand, letters, choices):
    c = _clean(re.sub(r"\\text\{([^}]*)\}", r"\1", cand))
    m = re.fullmatch(rf"\(?([{letters}])\)?[.):]?|\(([{letters.lower()}])\)", c)
    if m:  # a bare letter is a letter even when an option's text is also "C"
        return (m.group(1) or m.group(2)).upper()
    # The option's own text ("Answer: a marsh") wins over letter guessing: as written first, where
    # "-15" is not "15" and "Rr" not "RR", then a stated value by value ("4 km" is "4km", "$12.00"
    # is "$12"), other text in any case and punctuation (never a value: "12.00" would be "1,200").
    value = _option_value(c)
    plain = lambda x: x.strip().rstrip(".").strip()
    tests = [lambda ch: plain(ch) == plain(c),
             (lambda ch: _same_value(_option_value(ch), value)) if value
             else (lambda ch: _text_norm(ch) == _text_norm(c))]
    for test in tests if choices else ():
        hits = [i for i, ch in enumerate(choices) if test(str(ch))]
        if len(hits) == 1:
            return letters[hits[0]]
        if hits:
            break  # two options say the same: it names none
    m = (re.match(rf"^\(?([{letters}])\)?(?:[.):,\s]|$)", c)
         or re.match(rf"^\(([{letters.lower()}])\)", c)
         or re.match(rf"^([{letters.lower()}])(?:[.)]|$)", c)
         or re.search(rf"\(([{letters}{letters.lower()}])\)", c)
         or re.search(rf"\b(?:option|choice)\s+([{letters}])\b", c, flags=re.I))
    return m.group(1).upper() if m else None


# Currency marks say nothing among one question's options ("Rs. 250", "$12", "12 dollars").
_CURRENCY = r"(?:rs\.?|inr|usd|us\$|\\?\$|€|£|₹)"
_MONEY_WORD = r"\s*(?:dollars?|rupees?|rs\.?|usd|inr)$"


def _option_value(s):
    """(value, unit) that an option or a reply states ("Rs. 250" -> (250, ""), "4 km" -> (4, "km"),
    "4,000", "20 percent" -> (20, "%")), or None when it is not a number with at most a unit."""
    s = re.sub(rf"^{_CURRENCY}\s*", "", re.sub(r"\s+", " ", str(s).strip().rstrip(".").lower()))
    m = re.fullmatch(r"([+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+)(?:\s*/\s*(\d+))?\s*([a-z%/ .]*)", s)
    if not m or m.group(2) == "0":
        return None
    value = Fraction(m.group(1).replace(",", "")) / int(m.group(2) or 1)
    unit = re.sub(r"per\s*cent", "%", re.sub(_MONEY_WORD, "", m.group(3)).strip())
    return value, unit


def _same_value(a, b):
    """Same value, and the same unit ("days" is "day") or one side with none and the other a real
    unit ("36" is "36 minutes", "2" is not "2k")."""
    if a is None or b is None or a[0] != b[0]:
        return False
    ua, ub = (re.sub(r"(?<=\w\w)s\b", "", u).replace(" ", "").replace(".", "") for u in (a[1], b[1]))
    if ua == ub:
        return True
    other = a[1] or b[1]
    return not (ua and ub) and (other == "%" or re.fullmatch(_UNIT, other, flags=re.I) is not None)


_BOOL = {"yes": "yes", "true": "yes", "no": "no", "false": "no",
         "entailment": "yes", "not entailment": "no", "not_entailment": "no", "entails": "yes"}
# Negated prose first: "That is not true." is a no, "does not entail the hypothesis" too.
_BOOL_RE = r"\b(not[ _]entailment|(?:does\s+)?not\s+(?:true|entail(?:s|ed)?)|entails|entailment|yes|no|true|false)\b"


def _bool_word(w):
    w = re.sub(r"\s+", " ", w.lower())
    return "no" if w.startswith(("not ", "does not")) else _BOOL[w]


def _extract_bool(text):
    for cand in (last_boxed(text), _answer_line(text)):
        if cand is not None:
            m = re.search(_BOOL_RE, cand, flags=re.I)
            if m:
                return _bool_word(m.group(1))
    m = re.match(r"\W*" + _BOOL_RE, text, flags=re.I)  # "Yes, because ..."
    if m:
        return _bool_word(m.group(1))
    hits = re.findall(_BOOL_RE, text, flags=re.I)
    return _bool_word(hits[-1]) if hits else None


# Pairwise judgements. Markers that introduce a verdict; "answer" alone is not one ("Assistant 1's
# answer is more detailed" is not a verdict).
_VERDICT_MARK = re.compile(r"(?i)\b(?:(?:final\s+)?verdict|decision|judge?ment|winner|final\s+answer|conclusion"
                           r"|the\s+better\s+(?:assistant|answer|response)(?:\s+is)?)\b\s*(?:is\b|:|=|-)?\s*")
_WHO = r"(?:assistant|answer|response|output)"
_VERDICT_WORDS = [
    ("tie", re.compile(r"(?i)\b(?:tie|tied|draw|equal|equally)\b")),
    ("win", re.compile(rf"(?i)\b{_WHO}\s*(?:1|one|a)\b|\bfirst\b|\bwins?\b|^\W*(?:1|a)\W*$")),
    ("lose", re.compile(rf"(?i)\b{_WHO}\s*(?:2|two|b)\b|\bsecond\b|\blose[sr]?\b|^\W*(?:2|b)\W*$")),
]


def _verdict_in(s):
    """The verdict a short segment states: the one whose word comes first in it."""
    found = [(m.start(), v) for v, rx in _VERDICT_WORDS for m in [rx.search(s)] if m]
    return min(found)[1] if found else None


def _extract_verdict(text):
    """The verdict in a judge's output, tried in this order: the segment after the last verdict
    marker ("Verdict: Assistant 1"); MT-Bench's [[A]] / [[B]] / [[C]]; FairEval's first line of two
    scores ("8 7": the higher wins); a sentence "Assistant 2 is better" or "it is a tie"; a reply
    of a few words ("Assistant 1", "tie"). None when nothing clear is stated."""
    for m in reversed(list(_VERDICT_MARK.finditer(text))):
        rest = text[m.end():].lstrip()
        got = _verdict_in(re.split(r"[\n.;]", rest, maxsplit=1)[0]) if rest else None
        if got:
            return got
    brackets = re.findall(r"\[\[\s*([ABC12]|tie)\s*\]\]", text, flags=re.I)
    if brackets:
        return {"a": "win", "1": "win", "b": "lose", "2": "lose"}.get(brackets[-1].lower(), "tie")
    first = text.strip().split("\n")[0] if text.strip() else ""
    scores = re.fullmatch(r"\W*(\d+(?:\.\d+)?)(?:\s*/\s*10)?\s*[,\s]\s*(\d+(?:\.\d+)?)(?:\s*/\s*10)?\W*", first)
    if scores:
        a, b = float(scores.group(1)), float(scores.group(2))
        return "win" if a > b else "lose" if a < b else "tie"
    said = [(m.start(), "win" if m.group(1) in ("1", "one") else "lose") for m in re.finditer(
        rf"(?i)\b{_WHO}\s*(1|2|one|two)\b(?:(?!{_WHO}\s*(?:1|2|one|two)\b)[^.\n]){{0,80}}?"
        r"\b(?:is|was|does|did|performs?|performed)\s+"
        r"(?:\w+\s+){0,2}(?:better|superior|the\s+(?:winner|better\s+one)|preferable|preferred)\b", text)]
    said += [(m.start(), "tie") for m in re.finditer(
        r"(?i)\b(?:it(?:'s|\s+is)\s+a\s+tie|a\s+tie\b|(?:are|performed|did)\s+equally\s+(?:well|good|helpful))", text)]
    if said:
        return max(said)[1]
    if len(text.split()) <= 4:
        return _verdict_in(text)
    return None


def _extract_translation(text):
    """The translation in a model's output: the first non-empty line after the last
    "Translation:" / "English:" marker, else the first non-empty line."""
    hits = list(re.finditer(r"(?i)\btranslation\b[^:\n]{0,40}:|\benglish\s*:", text))
    rest = text[hits[-1].end():] if hits else text
    for line in rest.splitlines():
        line = line.strip().strip("*").strip().strip('"“”').strip()
        if line:
            return line
    return None


# ---------------------------------------------------------------------------------- normalisation

def normalize_answer(answer, kind, simplify=True):
    """Canonical form for grouping votes; None when the answer is missing or unreadable.

    simplify=False skips sympy's simplify for symbolic answers (a cheaper form, for `is_correct`,
    which settles any remaining difference with `_math_equal` itself)."""
    _check_kind(kind)
    if answer is None:
        return None
    a = str(answer).strip()
    if kind == "choice":
        m = re.fullmatch(r"\(?([A-Ja-j])\)?[.):]?", _clean(re.sub(r"\\text\{([^}]*)\}", r"\1", a)))
        return m.group(1).upper() if m else None
    if kind == "bool":
        return _BOOL.get(_clean(a).lower().replace("not entailment", "not_entailment"))
    if kind in ("text", "translation"):
        return _text_norm(a) or None
    if kind == "verdict":
        a = _clean(a).lower()
        return a if a in VERDICTS else _verdict_in(a)
    if kind == "code":
        return "\n".join(line.rstrip() for line in a.strip().splitlines()) or None
    if kind == "number":
        x = _to_fraction(a)
        if x is not None:
            return _canon_number(x)
    s = strip_math(a)
    if not s:
        return None
    return _canon_math(s, simplify)


def strip_math(s):
    """MATH-style string normalisation (after Hendrycks et al.'s `strip_string`, extended)."""
    s = str(s).strip()
    s = re.sub(r"\\text\{\s*\}", "", s)
    s = s.replace("\n", "").replace("\\!", "").replace("\\displaystyle", "")
    s = re.sub(r"\\[,;: ]|~", " ", s.replace("\\\\", "\0r")).replace("\0r", "\\\\")  # "\\\\" is a row break
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:d|t)frac", r"\\frac", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\^\s*\{?\\circ\}?|°|\\degree", "", s)
    s = s.replace("\\%", "").replace("%", "")
    # Units: "\text{ cm}" ending an answer (MATH's convention: the leading space marks a unit, not a
    # word answer), unless it is a scale ("\text{ million}") or a single letter ("\text{ k}").
    m = re.fullmatch(r"(.*\S)\s*\\(?:text|mbox|mathrm)\{\s+([^{}]*?)\s*\}(?:\^\{?[23]\}?)?", s)
    if m and (re.fullmatch(rf"{_UNIT}|{_ONE}", m.group(2), flags=re.I)
              or re.fullmatch(r"[A-Za-z]{2,}[A-Za-z\s.]*", m.group(2)) and not re.match(_SCALES, m.group(2), flags=re.I)):
        s = m.group(1)
    s = _strip_word_unit(s.strip().rstrip("."))  # before \text{} is unwrapped: "5\text{ cm}k" is no word
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm|mathbf)\{([^{}]*)\}", r"\1", s)
    s = _or_list(s)
    s = s.replace("{,}", "")
    s = s.replace("{bmatrix}", "{pmatrix}")  # the same matrix in other brackets
    s = re.sub(r"(\d)_\{(\w+)\}", r"\1_\2", s)  # base subscripts: "101_{2}" is "101_2"
    s = s.strip().rstrip(".").strip()
    m = re.fullmatch(r"[a-zA-Z](?:_\{?\w+\}?)?\s*(?:=|\\in\b)\s*([^=]+)", s)  # "x = 5" -> "5", "x \in [2,5)" -> "[2,5)"
    if m:
        s = m.group(1)
    s = _strip_unit(s)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = re.sub(r"(?<![\d\w])\.(\d)", r"0.\1", s)
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])", "\\1\0", s)  # keep "\cot x" apart
    return s.replace(" ", "").replace("\0", " ")


# Units a value may carry ("5 cm", "12 dollars", "3 km/h", "60 miles per hour"), dropped before
# comparing. A whitelist, not "any letters": "2k", "5i", "2x", "2pi" are other values than 2 or 5.
# One-letter symbols (m, s, g, h, l) count only in a rate ("m/s"): alone they are variables.
_UNIT_WORDS = ("mm cm km in inches inch ft foot feet yd yard mi mile meter metre centimeter centimetre millimeter "
               "millimetre kilometer kilometre sec second min minute hr hour day week month year yr mg kg gram "
               "milligram kilogram lb pound oz ounce ton tonne ml liter litre milliliter millilitre gallon gal "
               "quart pint cup dollar cent euro usd degree deg radian percent unit mph kph kmh").split()
_POWER = r"(?:\s*\^\s*\{?[23]\}?|[²³])?"
_TERM = (rf"(?:(?:square|sq|cubic|cu)\.?\s+)?(?:per\s*cent|{'|'.join(sorted(_UNIT_WORDS, key=len, reverse=True))})"
         rf"s?{_POWER}")
_ONE = rf"[msghl]{_POWER}"
_UNIT = rf"(?:(?:{_TERM}|{_ONE})\s*(?:/|\s+per\s+)\s*(?:{_TERM}|{_ONE})|{_TERM})\.?"
_SCALES = r"(?:hundred|thousand|million|billion|trillion|dozen)"


def _strip_unit(s):
    """`s` without a trailing unit ("5 cm" -> "5", "1.5 m/s" -> "1.5"); unchanged when no unit trails a value."""
    m = re.search(rf"(?<![A-Za-z\\])(?:{_UNIT})\s*$", s, flags=re.I)
    value = s[:m.start()].strip() if m else ""
    return value if re.search(r"[\w)\]}]$", value) else s


# Words after a number that change its value or make it maths, so never a unit word.
_NOT_UNIT_WORDS = {"squared", "cubed", "factorial", "half", "halves", "third", "thirds", "quarter", "quarters",
                   "hundredths", "thousandths", "root", "roots", "over", "plus", "minus", "times"}


def _strip_word_unit(s):
    """A number and the noun it counts ("9 pears", "12 red apples") -> the number. Words of three
    letters or more only: "2 x", "4 ab" are products, "3 million", "2 pi", "3 sin x" other values."""
    words = r"[A-Za-z]{3,}(?:\s+[A-Za-z]{3,})*"
    m = re.fullmatch(rf"({_NUM}(?:/\d+)?|\\frac\{{\d+\}}\{{\d+\}})"
                     rf"(?:\s*\\(?:text|mbox)\{{\s*({words})\s*\}}|\s+({words}))", s)
    if not m:
        return s
    words = {w.lower() for w in (m.group(2) or m.group(3)).split()}
    if words & (_NOT_UNIT_WORDS | _NAMES | set(_COMMANDS)) or any(re.match(_SCALES, w) for w in words):
        return s
    return m.group(1)


def _or_list(s):
    """'x = 3 or x = -1', '1, 2, and 3' -> comma lists, when every part holds a number (a word
    answer such as 'odd and even' stays as written)."""
    parts = re.split(r"\s*,?\s+(?:or|and)\s+", s)
    return ",".join(parts) if len(parts) > 1 and all(re.search(r"\d", p) for p in parts) else s


def _text_norm(s):
    s = str(s).lower()
    s = "".join(ch for ch in s if ch not in string.punctuation)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _canon_number(x: Fraction):
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.10g}"


def _to_fraction(s):
    """Exact value of a plain number: '1,000', '$5.00', '-3/4', '12 dollars', '50%' -> Fraction."""
    s = str(s).strip().replace("$", "").replace("\\$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\\(?:d|t)?frac\{(-?\d+)\}\{(\d+)\}", r"\1/\2", s)
    s = _strip_unit(s.strip().rstrip(".")).rstrip(".")
    if not re.fullmatch(rf"(?:{_NUM})(?:/\d+)?", s):
        return None
    s = s.replace(",", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _canon_math(s, simplify=True):
    items = _solutions(s)
    if items is not None:  # unordered: its canonical items, sorted
        return ",".join(sorted(_canon_math(x, simplify) for x in items))
    x = _to_fraction(s)
    if x is not None:
        return _canon_number(x)
    rows = _matrix(s)
    if rows is not None:
        return _MATRIX.format("\\\\".join("&".join(_canon_math(x, simplify) for x in r) for r in rows))
    parts = _split_tuple(s)
    if parts:
        left, items, right = parts
        return left + ",".join(_canon_math(p, simplify) for p in items) + right
    if re.fullmatch(r"\([A-Ja-j]\)", s):  # an option label: "(c)" is MATH's "\text{(C)}"
        return s[1].upper()
    expr = _parse(s)
    if expr is None:  # not maths: a word ("Evelyn") or other text, where case does not count
        return s.lower() if re.fullmatch(r"[A-Za-z][A-Za-z'-]*", s) else s
    return _timed(lambda: _canon_expr(expr, simplify), SYMPY_SECONDS) or s


def _canon_expr(expr, simplify=True):
    import sympy
    if not expr.free_symbols:
        if expr.is_Rational:
            return _canon_number(Fraction(int(expr.p), int(expr.q)))
        v = complex(sympy.N(expr, 15))
        if abs(v.imag) < 1e-12:  # any real constant: its value, so all its spellings group together
            return str(int(v.real)) if v.real == int(v.real) else f"{v.real:.10g}"
    return str(sympy.simplify(expr) if simplify else expr)


# ---------------------------------------------------------------------------------- the one check

def is_correct(predicted, gold, kind):
    """True when `predicted` (an extracted answer) is equivalent to `gold` for this kind. `gold`
    may be a list of accepted answers (CIAR's): any one matches. People wrote those lists, and
    their decimals are rounded ("0.67" for 2/3), so a more precise number that rounds to an
    accepted decimal of two or more places counts too."""
    _check_kind(kind)
    if kind == "translation":
        raise ValueError("translations are scored by BLEU/chrF (byzantium.tasks.resilience.score_output), "
                         "not by is_correct")
    if isinstance(gold, (list, tuple)):
        return any(is_correct(predicted, g, kind) or (kind in ("number", "math") and _rounds_to(predicted, g))
                   for g in gold)
    if predicted is None or gold is None:
        return False
    # the cheap canonical form: a symbolic pair that still differs goes to _math_equal's spot checks
    p, g = normalize_answer(predicted, kind, simplify=False), normalize_answer(gold, kind, simplify=False)
    if p is None or g is None:
        return False
    if p == g:
        return True
    if kind in ("choice", "bool", "text", "code", "verdict"):
        return False
    return _math_equal(strip_math(predicted), strip_math(gold))


def _rounds_to(predicted, accepted):
    """Does a plain decimal with more places round to `accepted` ("0.6667" -> "0.67", "9.0909%" ->
    "9.09%")? Percent signs must agree."""
    if predicted is None or accepted is None:
        return False
    p, a = str(predicted).strip(), str(accepted).strip()
    dec = re.fullmatch(r"-?\d+\.(\d+)%?", a)
    pdec = re.fullmatch(r"-?\d+\.(\d+)%?", p)
    if not dec or not pdec or len(dec.group(1)) < 2 or len(pdec.group(1)) <= len(dec.group(1)):
        return False
    if p.endswith("%") != a.endswith("%"):
        return False
    return round(Fraction(p.rstrip("%")), len(dec.group(1))) == Fraction(a.rstrip("%"))


def _math_equal(a, b):
    sa, sb = _solutions(a), _solutions(b)
    if sa is not None or sb is not None:  # a one-item set is its item: "\{5\}" is "5"
        return _same_items(sa if sa is not None else [a], sb if sb is not None else [b])
    ma, mb = _matrix(a), _matrix(b)
    if ma is not None or mb is not None:
        return bool(ma and mb and [len(r) for r in ma] == [len(r) for r in mb]
                    and all(_math_equal(x, y) for ra, rb in zip(ma, mb) for x, y in zip(ra, rb)))
    xa, xb = _to_fraction(a), _to_fraction(b)
    if xa is not None and xb is not None:
        if _terminates(xa) and _terminates(xb):  # two decimals: equal exactly ("1450001" is not 1450000)
            return xa == xb
        return math.isclose(float(xa), float(xb), rel_tol=REL_TOL, abs_tol=1e-12)  # "0.3333333" vs 1/3
    pa, pb = _split_tuple(a), _split_tuple(b)
    if pa or pb:
        return bool(pa and pb and pa[0] == pb[0] and pa[2] == pb[2] and len(pa[1]) == len(pb[1])
                    and all(_math_equal(x, y) for x, y in zip(pa[1], pb[1])))
    if a.count("=") == 1 and b.count("=") == 1:  # equations: same sides
        return all(_math_equal(x, y) for x, y in zip(a.split("="), b.split("=")))
    ea, eb = _parse(a), _parse(b)
    if ea is None or eb is None:
        return False
    return bool(_timed(lambda: _sympy_equal(ea, eb), SYMPY_SECONDS))


def _sympy_equal(ea, eb):
    import random
    import sympy
    d = ea - eb
    syms = sorted(d.free_symbols, key=str)
    if not syms:
        va, vb = complex(sympy.N(ea, 20)), complex(sympy.N(eb, 20))
        return abs(va - vb) <= REL_TOL * max(1.0, abs(vb))
    # Numeric spot checks first: cheap, they settle almost every pair; simplify only where a point
    # could not be evaluated (a pole, a branch).
    rng, settled = random.Random(0), True
    for _ in range(3):
        point = {s: rng.uniform(0.5, 2.5) for s in syms}
        try:
            va, vb = complex(ea.evalf(15, subs=point)), complex(eb.evalf(15, subs=point))
        except (TypeError, ValueError):
            va = vb = math.nan
        if abs(va - vb) > 1e-8 * max(1.0, abs(vb)):
            return False
        settled = settled and abs(va - vb) <= 1e-8 * max(1.0, abs(vb))
    return settled or sympy.simplify(d) == 0


def _terminates(x: Fraction):
    """Is x a finite decimal (its denominator has no prime factor but 2 and 5)?"""
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def _solutions(s):
    """Items of an unordered answer, or None. Unordered: a set ("\\{1,2\\}", or "{1,2}", which LaTeX
    prints as 1, 2), a bare list of solutions ("-1,3", "x=3,x=-1") and a "\\pm" ("1\\pm\\sqrt{19}" is
    two roots). Bracketed lists are ordered: tuples, points "(1,2)", intervals "[2,5)"."""
    m = re.fullmatch(r"\\\{(.*)\\\}", s) or re.fullmatch(r"\{(.*)\}", s)
    if m and _balanced(m.group(1)):
        items = _top_split(m.group(1))
    elif _split_tuple(s) and not _split_tuple(s)[0]:
        items = _split_tuple(s)[1]
    elif s.count("\\pm") == 1:
        items = [s]
    else:
        return None
    names = {re.match(r"[a-zA-Z]=|", x).group() for x in items}
    if len(names) == 1:  # "x=3,x=-1" names one unknown: its values ("x=3,y=4" keeps its names)
        items = [x[len(next(iter(names))):] for x in items]
    return [y for x in items for y in _pm(x)]


def _pm(s):
    """'a\\pmb' -> ['a+b', 'a-b']: the two values it stands for; other items unchanged."""
    if s.count("\\pm") != 1:
        return [s]
    a, b = s.split("\\pm")
    return [f"{a}+{b}", f"{a}-{b}"]


_MATRIX = "\\begin{{pmatrix}}{}\\end{{pmatrix}}"


def _matrix(s):
    """Rows of entries of a pmatrix (bmatrix is made one by strip_math), or None."""
    m = re.fullmatch(r"\\begin\{pmatrix\}(.*)\\end\{pmatrix\}", s)
    return [r.split("&") for r in m.group(1).split("\\\\")] if m else None


def _same_items(xs, ys):
    """Are two lists equal in any order (each item of xs matched to its own item of ys)?"""
    left = list(ys)
    for x in xs:
        j = next((j for j, y in enumerate(left) if _math_equal(x, y)), None)
        if j is None:
            return False
        left.pop(j)
    return not left


def _split_tuple(s):
    """'(1,2]' -> ('(', ['1', '2'], ']'); plain top-level comma lists get empty brackets."""
    left, right, inner = "", "", s
    if len(s) >= 2 and s[0] in "([{" and s[-1] in ")]}" and _balanced(s[1:-1]):
        left, right, inner = s[0], s[-1], s[1:-1]
    parts = _top_split(inner)
    return (left, parts, right) if len(parts) > 1 else None


def _top_split(s):
    """s split at its top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _balanced(s):
    depth = 0
    for ch in s:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            return False
    return depth == 0


# --------------------------------------------------------------------------- LaTeX -> sympy, safely

_FUNCS = {"sqrt", "log", "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "exp", "pi", "oo"}
_GREEK = {"alpha", "beta", "gamma", "delta", "theta", "lambda", "mu", "phi", "omega", "sigma", "tau"}
_NAMES = _FUNCS | _GREEK
_COMMANDS = {"pi": "pi", "infty": "oo", "cdot": "*", "times": "*", "div": "/", "ln": "log", "log": "log",
             "arcsin": "asin", "arccos": "acos", "arctan": "atan",
             **{f: f for f in ("sin", "cos", "tan", "cot", "sec", "csc", "exp")}, **{g: g for g in _GREEK}}


@functools.lru_cache(maxsize=4096)
def _parse(s):
    """Sympy expression for a normalised answer, or None (unknown LaTeX, unsafe or too big)."""
    try:
        text = _tex_to_text(s)
    except ValueError:
        return None
    if not re.fullmatch(r"[0-9a-zA-Z+\-*/().\s]*", text) or not text.strip() or len(text) > 300:
        return None
    # Two-letter names are products ("xy" -> "x*y"); longer unknown words are not math.
    words = re.findall(r"[A-Za-z]+", text)
    if any(len(w) > 2 and w not in _NAMES for w in words):
        return None
    text = re.sub(r"[A-Za-z]+", lambda m: m.group(0) if m.group(0) in _NAMES else "*".join(m.group(0)), text)
    if (re.search(r"\d{40}", text) or re.search(r"\*\*[^+\-*/]*\*\*", text)  # no towers of powers
            or any(_too_big(e) for e in re.findall(r"\*\*\s*\(?([\d.]+)", text))):
        return None
    _import_sympy()
    return _timed(lambda: _parse_expr(text), SYMPY_SECONDS)


def _import_sympy():
    """Import sympy outside any time limit: an import interrupted by the alarm leaves sympy
    half-initialised for the rest of the process."""
    import sympy  # noqa: F401
    import sympy.parsing.sympy_parser  # noqa: F401


def _too_big(exponent):
    try:
        return float(exponent) > 1000
    except ValueError:
        return True


def _parse_expr(text):
    import sympy
    from sympy.parsing.sympy_parser import (convert_xor, implicit_multiplication_application,
                                            parse_expr, rationalize, standard_transformations)
    names = {c: sympy.Symbol(c) for c in string.ascii_letters}
    names.update({g: sympy.Symbol(g) for g in _GREEK})
    names.update({f: getattr(sympy, f) for f in _FUNCS})
    tr = standard_transformations + (implicit_multiplication_application, convert_xor, rationalize)
    try:
        return parse_expr(text, local_dict=names, global_dict={"__builtins__": {}, **_sympy_atoms()},
                          transformations=tr)
    except Exception:  # anything unparsable is simply not an expression
        return None


def _sympy_atoms():
    import sympy
    return {"Integer": sympy.Integer, "Float": sympy.Float, "Rational": sympy.Rational,
            "Symbol": sympy.Symbol, "Function": sympy.Function}


def _tex_to_text(s):
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if s.startswith("\\frac", i):
            a, i = _arg(s, i + 5)
            b, i = _arg(s, i)
            out.append(f"(({_tex_to_text(a)})/({_tex_to_text(b)}))")
        elif s.startswith("\\sqrt", i):
            i += 5
            if i < len(s) and s[i] == "[":
                j = s.index("]", i)
                root = _tex_to_text(s[i + 1:j])
                a, i = _arg(s, j + 1)
                out.append(f"(({_tex_to_text(a)})**(1/({root})))")
            else:
                a, i = _arg(s, i)
                out.append(f"sqrt({_tex_to_text(a)})")
        elif c == "\\":
            m = re.match(r"\\([a-zA-Z]+)", s[i:])
            if not m or m.group(1) not in _COMMANDS:
                raise ValueError(f"unsupported LaTeX at {s[i:i + 12]!r}")
            out.append(f" {_COMMANDS[m.group(1)]} ")
            i += m.end()
        elif c == "^":
            a, i = _arg(s, i + 1)
            out.append(f"**({_tex_to_text(a)})")
        elif c == "{":
            a, i = _arg(s, i)
            out.append(f"({_tex_to_text(a)})")
        elif c == "}":
            raise ValueError("unbalanced braces")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _arg(s, i):
    """One macro argument starting at s[i]: a {group}, a \\command, or one character."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise ValueError("missing argument")
    if s[i] == "{":
        depth = 0
        for k in range(i, len(s)):
            depth += {"{": 1, "}": -1}.get(s[k], 0)
            if depth == 0:
                return s[i + 1:k], k + 1
        raise ValueError("unbalanced braces")
    if s[i] == "\\":
        m = re.match(r"\\[a-zA-Z]+", s[i:])
        if m:
            return m.group(0), i + m.end()
    return s[i], i + 1


# -------------------------------------------------------------------------------------- utilities

class _Timeout(Exception):
    pass


def _timed(fn, seconds):
    """fn() or None if it takes longer than `seconds`. SIGALRM interrupts it on the main thread;
    elsewhere it runs on a daemon thread that is abandoned on timeout."""
    use_signal = (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
                  and signal.getitimer(signal.ITIMER_REAL)[0] == 0)
    if use_signal:
        def alarm(*_):
            raise _Timeout
        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn()
        except _Timeout:
            return None
        except Exception:
            return None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    box = []

    def run():
        try:
            box.append(fn())
        except Exception:
            box.append(None)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return box[0] if box else None


def _check_kind(kind):
    if kind not in KINDS:
        raise ValueError(f"answer kind must be one of {KINDS}, got {kind!r}")
