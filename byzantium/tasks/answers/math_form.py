"""Canonical forms of numeric and MATH answers, equal for equivalent answers ("1/2", "\\frac{1}{2}",
"0.5" -> "0.5"): MATH-style string normalisation, exact fractions, and for expressions sympy's form of
math-verify's parse (latex.py). math-verify has no canonical string of its own (it only compares two
answers), and votes are grouped by one."""

import re
from fractions import Fraction

from .latex import parse_math
from .reading import NUMBER
from .structure import BASE, solutions, split_tuple
from .time_limit import SYMPY_SECONDS, timed
from .units import SCALES, UNIT, UNIT_SYMBOL, strip_unit, strip_word_unit


def strip_math(s):
    """MATH-style string normalisation (after Hendrycks et al.'s `strip_string`, extended) for what
    comes before parsing: units off, the parts of lists and tuples visible, one spelling of a number.
    Malformed operators ("\\frac12", "\\sqrt2") and matrix brackets are math-verify's parser's."""
    s = str(s).strip()
    s = re.sub(r"\\text\{\s*\}", "", s)
    s = re.sub(r",\\!\s*", ",", s)  # a thousands separator "11,\! 111" (MATH writes it with a space too)
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
    if m and (re.fullmatch(rf"{UNIT}|{UNIT_SYMBOL}", m.group(2), flags=re.I)
              or re.fullmatch(r"[A-Za-z]{2,}[A-Za-z\s.]*", m.group(2)) and not re.match(SCALES, m.group(2), flags=re.I)):
        s = m.group(1)
    s = strip_word_unit(s.strip().rstrip("."))  # before \text{} is unwrapped: "5\text{ cm}k" is no word
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm|mathbf)\{([^{}]*)\}", r"\1", s)
    s = _or_list(s)
    s = s.replace("{,}", "")
    s = re.sub(r"(\d)_\{(\w+)\}", r"\1_\2", s)  # base subscripts: "101_{2}" is "101_2"
    s = s.strip().rstrip(".").strip()
    m = re.fullmatch(r"[a-zA-Z](?:_\{?\w+\}?)?\s*(?:=|\\in\b)\s*([^=]+)", s)  # "x = 5" -> "5", "x \in [2,5)" -> "[2,5)"
    if m:
        s = m.group(1)
    s = strip_unit(s)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = re.sub(r"(?<![\d\w])\.(\d)", r"0.\1", s)
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])", "\\1\0", s)  # keep "\cot x" apart
    return s.replace(" ", "").replace("\0", " ")


def _or_list(s):
    """'x = 3 or x = -1', '1, 2, and 3' -> comma lists, when every part holds a number (a word
    answer such as 'odd and even' stays as written)."""
    parts = re.split(r"\s*,?\s+(?:or|and)\s+", s)
    return ",".join(parts) if len(parts) > 1 and all(re.search(r"\d", p) for p in parts) else s


def canon_number(x: Fraction):
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.10g}"


def to_fraction(s):
    """Exact value of a plain number: '1,000', '$5.00', '-3/4', '12 dollars', '50%' -> Fraction."""
    s = str(s).strip().replace("$", "").replace("\\$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"(?<![\d.])\\(?:d|t)?frac\{(-?\d+)\}\{(\d+)\}", r"\1/\2", s)  # not a mixed number "1\frac{4}{5}"
    s = strip_unit(s.strip().rstrip(".")).rstrip(".")
    if not re.fullmatch(rf"(?:{NUMBER})(?:/\d+)?", s):
        return None
    s = s.replace(",", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def canon_math(s, simplify=True):
    items = solutions(s)
    if items is not None:  # unordered: its canonical items, sorted
        return ",".join(sorted(canon_math(x, simplify) for x in items))
    x = to_fraction(s)
    if x is not None:
        return canon_number(x)
    parts = split_tuple(s)
    if parts:
        left, items, right = parts
        return left + ",".join(canon_math(p, simplify) for p in items) + right
    if re.fullmatch(r"\([A-Ja-j]\)", s):  # an option label: "(c)" is MATH's "\text{(C)}"
        return s[1].upper()
    if BASE.search(s):  # another base: its own spelling (the parse would drop the base)
        return s
    expr = parse_math(s)
    if expr is None:  # not maths: a word ("Evelyn") or other text, where case does not count
        return s.lower() if re.fullmatch(r"[A-Za-z][A-Za-z'-]*", s) else s
    return timed(lambda: _canon_expr(expr, simplify), SYMPY_SECONDS) or s


def _canon_expr(expr, simplify=True):
    import sympy
    if isinstance(expr, sympy.MatrixBase):  # its entries' forms, in its shape
        rows = [[_canon_expr(x, simplify) for x in expr.row(i)] for i in range(expr.rows)]
        return "\\begin{pmatrix}" + "\\\\".join("&".join(r) for r in rows) + "\\end{pmatrix}"
    if not isinstance(expr, sympy.Expr):  # an equation, a set, an interval: sympy's own form
        return str(expr)
    if not expr.free_symbols:
        if expr.is_Rational:
            return canon_number(Fraction(int(expr.p), int(expr.q)))
        v = complex(sympy.N(expr, 15))
        if abs(v.imag) < 1e-12:  # any real constant: its value, so all its spellings group together
            return str(int(v.real)) if v.real == int(v.real) else f"{v.real:.10g}"
    return str(sympy.simplify(expr) if simplify else expr)
