"""Units a value may carry, and taking them off it: a whitelist, never "any letters"."""

import re

from .latex import MATH_NAMES
from .reading import NUMBER


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
UNIT_SYMBOL = rf"[msghl]{_POWER}"
UNIT = rf"(?:(?:{_TERM}|{UNIT_SYMBOL})\s*(?:/|\s+per\s+)\s*(?:{_TERM}|{UNIT_SYMBOL})|{_TERM})\.?"
SCALES = r"(?:hundred|thousand|million|billion|trillion|dozen)"


def strip_unit(s):
    """`s` without a trailing unit ("5 cm" -> "5", "1.5 m/s" -> "1.5"); unchanged when no unit trails a value."""
    m = re.search(rf"(?<![A-Za-z\\])(?:{UNIT})\s*$", s, flags=re.I)
    value = s[:m.start()].strip() if m else ""
    return value if re.search(r"[\w)\]}]$", value) else s


# Words after a number that change its value or make it maths, so never a unit word.
_NOT_UNIT_WORDS = {"squared", "cubed", "factorial", "half", "halves", "third", "thirds", "quarter", "quarters",
                   "hundredths", "thousandths", "root", "roots", "over", "plus", "minus", "times"}


def strip_word_unit(s):
    """A number and the noun it counts ("9 pears", "12 red apples") -> the number. Words of three
    letters or more only: "2 x", "4 ab" are products, "3 million", "2 pi", "3 sin x" other values."""
    words = r"[A-Za-z]{3,}(?:\s+[A-Za-z]{3,})*"
    m = re.fullmatch(rf"({NUMBER}(?:/\d+)?|\\frac\{{\d+\}}\{{\d+\}})"
                     rf"(?:\s*\\(?:text|mbox)\{{\s*({words})\s*\}}|\s+({words}))", s)
    if not m:
        return s
    words = {w.lower() for w in (m.group(2) or m.group(3)).split()}
    if words & (_NOT_UNIT_WORDS | MATH_NAMES) or any(re.match(SCALES, w) for w in words):
        return s
    return m.group(1)
