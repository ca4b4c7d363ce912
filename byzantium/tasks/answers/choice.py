"""Multiple-choice answers: the option letter a reply picks, named by its letter or by the option's
own text or value ("Answer: a marsh", "Rs. 250")."""

import re
from fractions import Fraction

from .reading import answer_line, last_boxed, normalize_text, strip_marks
from .units import UNIT

LETTERS = "ABCDEFGHIJ"


def extract_choice(text, choices):
    """The letter of the option a reply picks (of LETTERS, as many as `choices`), or None."""
    letters = LETTERS[:len(choices)] if choices else LETTERS
    for cand in (last_boxed(text), answer_line(text)):
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
    c = strip_marks(re.sub(r"\\text\{([^}]*)\}", r"\1", cand))
    m = re.fullmatch(rf"\(?([{letters}])\)?[.):]?|\(([{letters.lower()}])\)", c)
    if m:  # a bare letter is a letter even when an option's text is also "C"
        return (m.group(1) or m.group(2)).upper()
    # The option's own text ("Answer: a marsh") wins over letter guessing: as written first, where
    # "-15" is not "15" and "Rr" not "RR", then a stated value by value ("4 km" is "4km", "$12.00"
    # is "$12"), other text in any case and punctuation (never a value: "12.00" would be "1,200").
    value = _option_value(c)
    def plain(x):
        return x.strip().rstrip(".").strip()
    tests = [lambda ch: plain(ch) == plain(c),
             (lambda ch: _same_value(_option_value(ch), value)) if value
             else (lambda ch: normalize_text(ch) == normalize_text(c))]
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
    return not (ua and ub) and (other == "%" or re.fullmatch(UNIT, other, flags=re.I) is not None)
