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

The pieces, each in its own file: reading.py (\\boxed{}, "The answer is", numbers, translations),
choice.py (option letters), judgements.py (yes/no, verdicts), units.py (the unit whitelist),
math_form.py (canonical forms), structure.py (sets, tuples, matrices), math_equal.py (equivalence),
latex.py (LaTeX -> sympy) and time_limit.py (the limit on every sympy call).
"""

import re
from fractions import Fraction

from .choice import extract_choice
from .judgements import BOOL_WORDS, VERDICTS, extract_bool, extract_verdict, verdict_in
from .math_equal import math_equal
from .math_form import canon_math, canon_number, strip_math, to_fraction
from .reading import (answer_line, extract_translation, last_boxed, last_number, normalize_text, number_in,
                      strip_marks)

KINDS = ("number", "math", "choice", "bool", "text", "code", "verdict", "translation")


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
        return extract_choice(text, choices)
    if kind == "bool":
        return extract_bool(text)
    if kind == "verdict":
        return extract_verdict(text)
    if kind == "translation":
        return extract_translation(text)
    cand = last_boxed(text)
    if cand is None:
        cand = answer_line(text)
    if kind == "number":
        if cand is None:
            m = re.findall(r"####\s*(.+)", text)
            return number_in(m[-1]) if m else last_number(text)
        return number_in(cand)
    if kind == "math":
        if cand is not None:
            m = re.search(r"\$+([^$]+)\$+", cand)
            cand = m.group(1) if m else cand
        else:
            dollars = re.findall(r"\$+([^$]+)\$+", text)
            cand = dollars[-1] if dollars else last_number(text)
        return strip_marks(cand) if cand is not None else None
    return strip_marks(cand) if cand is not None else (text or None)  # text


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
