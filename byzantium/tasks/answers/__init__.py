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

MATH answers are parsed by latex2sympy2_extended and compared by math-verify (Hugging Face's
verifier); our own rules come first only where it judges otherwise (math_equal.py lists them).
Answers that would ask for an uninterruptible computation are never parsed, and every parse and
comparison runs under our time limit (math-verify's signal-based one works on the main thread only).

The pieces, each in its own file: reading.py (\\boxed{}, "The answer is", numbers, translations),
choice.py (option letters), judgements.py (yes/no, verdicts), units.py (the unit whitelist),
math_form.py (canonical forms), structure.py (sets, tuples), math_equal.py (equivalence),
latex.py (LaTeX -> sympy, guarded) and time_limit.py (the limit on every sympy call).
"""

import re
from fractions import Fraction

from .choice import LETTERS
from .conclusion import AMBIGUOUS, NOTHING, READ, UNREAD, Reading, clean, read_conclusion, strip_think
from .judgements import BOOL_WORDS, VERDICTS, verdict_in
from .kinds import (BoolValues, ChoiceValues, ConfidenceValues, MathValues, NumberValues, ScoreValues, TextValues,
                    VerdictValues)
from .math_equal import math_equal
from .math_form import canon_math, canon_number, strip_math, to_fraction
from .reading import extract_translation, normalize_text, strip_marks

__all__ = ["KINDS", "AMBIGUOUS", "READ", "UNREAD", "Reading", "read_answer", "extract_answer", "read_score",
           "read_confidence", "normalize_answer", "is_correct"]

KINDS = ("number", "math", "choice", "bool", "text", "code", "verdict", "translation")


def read_answer(text, kind, choices=None):
    """What a model's output commits to, as a Reading: `value` (a string; None unless status is
    "read") and `status`: "read", "unread" (no commitment found) or "ambiguous" (it commits to two
    different answers at the end, "(C) or (D)"). Every kind but code and translation goes through the
    one conclusion reader (conclusion.py); kinds.py says what each kind's values look like."""
    _check_kind(kind)
    if text is None:
        return NOTHING
    if kind == "code":
        text = strip_think(str(text)).strip()
        blocks = re.findall(r"```[\w+-]*\n(.*?)```", text, flags=re.S)
        code = (blocks[-1] if blocks else text).strip()
        return Reading(code, READ) if code else NOTHING
    if kind == "translation":
        line = extract_translation(clean(text))
        return Reading(line, READ) if line else NOTHING
    return read_conclusion(text, _values(kind, choices))


def extract_answer(text, kind, choices=None):
    """The answer stated in a model's output, as a string, or None when none is found (or it is
    ambiguous): read_answer(...).value."""
    return read_answer(text, kind, choices).value


def read_score(text):
    """A judge's score in [0, 1] (SAC): the last committed score; ratios and percentages scaled
    (7/10 -> 0.7, 85% -> 0.85), clipped. A reply that is only a value counts (the judge prompt ends
    in "Score:"). Numbers of the judge's working never count."""
    return read_conclusion(text, ScoreValues())


def read_confidence(text):
    """A reported confidence in [0, 1] (CP-WBFT): "Confidence: 0.9", "Confidence level: 0.8", "I am
    90% confident"; a percentage or a value above 1 is divided by 100."""
    return read_conclusion(text, ConfidenceValues())


def _values(kind, choices):
    if kind == "choice":
        return ChoiceValues(LETTERS[:len(choices)] if choices else LETTERS, choices)
    return {"number": NumberValues, "math": MathValues, "bool": BoolValues, "verdict": VerdictValues,
            "text": TextValues}[kind]()


def normalize_answer(answer, kind, simplify=True):
    """Canonical form for grouping votes; None when the answer is missing or unreadable.

    simplify=False skips sympy's simplify for symbolic answers (a cheaper form, for `is_correct`,
    which settles any remaining difference with `math_equal` itself)."""
    _check_kind(kind)
    if answer is None:
        return None
    a = str(answer).strip()
    if kind == "choice":
        m = re.fullmatch(r"\(?([A-Ja-j])\)?[.):]?", strip_marks(re.sub(r"\\text\{([^}]*)\}", r"\1", a)))
        return m.group(1).upper() if m else None
    if kind == "bool":
        return BOOL_WORDS.get(strip_marks(a).lower().replace("not entailment", "not_entailment"))
    if kind in ("text", "translation"):
        return normalize_text(a) or None
    if kind == "verdict":
        a = strip_marks(a).lower()
        return a if a in VERDICTS else verdict_in(a)
    if kind == "code":
        return "\n".join(line.rstrip() for line in a.strip().splitlines()) or None
    if kind == "number":
        x = to_fraction(a)
        if x is not None:
            return canon_number(x)
    s = strip_math(a)
    if not s:
        return None
    return canon_math(s, simplify)


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
    # the cheap canonical form: a symbolic pair that still differs goes to math_equal's spot checks
    p, g = normalize_answer(predicted, kind, simplify=False), normalize_answer(gold, kind, simplify=False)
    if p is None or g is None:
        return False
    if p == g:
        return True
    if kind in ("choice", "bool", "text", "code", "verdict"):
        return False
    return math_equal(strip_math(predicted), strip_math(gold))


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


def _check_kind(kind):
    if kind not in KINDS:
        raise ValueError(f"answer kind must be one of {KINDS}, got {kind!r}")
