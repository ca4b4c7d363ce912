"""Multiple-choice options: their letters, and the value an option states ("Rs. 250", "4 km"), so a
reply that names an option by its value names it (kinds.ChoiceValues)."""

import re
from fractions import Fraction

from .units import UNIT

LETTERS = "ABCDEFGHIJ"


# Currency marks say nothing among one question's options ("Rs. 250", "$12", "12 dollars").
_CURRENCY = r"(?:rs\.?|inr|usd|us\$|\\?\$|€|£|₹)"
_MONEY_WORD = r"\s*(?:dollars?|rupees?|rs\.?|usd|inr)$"


def option_value(s):
    """(value, unit) that an option or a reply states ("Rs. 250" -> (250, ""), "4 km" -> (4, "km"),
    "4,000", "20 percent" -> (20, "%")), or None when it is not a number with at most a unit."""
    if len(str(s)) > 80:  # no option is that long a number; and int() refuses thousands of digits
        return None
    s = re.sub(rf"^{_CURRENCY}\s*", "", re.sub(r"\s+", " ", str(s).strip().rstrip(".").lower()))
    m = re.fullmatch(r"([+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+)(?:\s*/\s*(\d+))?\s*([a-z%/ .]*)", s)
    if not m or m.group(2) == "0":
        return None
    value = Fraction(m.group(1).replace(",", "")) / int(m.group(2) or 1)
    unit = re.sub(r"per\s*cent", "%", re.sub(_MONEY_WORD, "", m.group(3)).strip())
    return value, unit


def same_value(a, b):
    """Same value, and the same unit ("days" is "day") or one side with none and the other a real
    unit ("36" is "36 minutes", "2" is not "2k")."""
    if a is None or b is None or a[0] != b[0]:
        return False
    ua, ub = (re.sub(r"(?<=\w\w)s\b", "", u).replace(" ", "").replace(".", "") for u in (a[1], b[1]))
    if ua == ub:
        return True
    other = a[1] or b[1]
    return not (ua and ub) and (other == "%" or re.fullmatch(UNIT, other, flags=re.I) is not None)
