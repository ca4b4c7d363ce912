"""Are two numeric or MATH answers equal? Expressions, matrices, equations and intervals are compared by
math-verify (Hugging Face's verifier). Our own rules come first, only where math-verify judges
otherwise than a grader of these data sets:

- lists of solutions are multisets ("1, 1, 2" is not "1, 2, 2"; math-verify's sets merge repeats),
  and a bracketed pair is a point, in order ("(1,2)" is not the list "1, 2", and "(2,1)" is not
  "(3,1)"; math-verify reads both as open intervals, equal to a two-item set, or empty and so equal);
- two plain decimals compare exactly ("0.1234567" is not "0.1234568"; math-verify rounds to 6
  places), and only a number with no exact decimal form within REL_TOL ("0.3333333" vs 1/3);
- a number in another base ("204_5") equals only its own spelling (math-verify drops the subscript).
"""

import cmath
import logging
import math
import random
from fractions import Fraction

from .latex import parse_math
from .math_form import to_fraction
from .structure import BASE, solutions, split_tuple
from .time_limit import SYMPY_SECONDS, timed

REL_TOL = 1e-6

# math-verify warns once that its own timeout is off: ours (time_limit.py) runs around every call.
logging.getLogger("math_verify.grader").setLevel(logging.ERROR)


def math_equal(a, b):
    """Is `a` (a normalised answer, see math_form.strip_math) equal to `b` (the gold, normalised)?"""
    sa, sb = solutions(a), solutions(b)
    if sa is not None or sb is not None:  # a one-item set is its item: "\{5\}" is "5"
        return _same_items(sa if sa is not None else [a], sb if sb is not None else [b])
    xa, xb = to_fraction(a), to_fraction(b)
    if xa is not None and xb is not None:
        if _terminates(xa) and _terminates(xb):  # two decimals: equal exactly ("1450001" is not 1450000)
            return xa == xb
        return math.isclose(float(xa), float(xb), rel_tol=REL_TOL, abs_tol=1e-12)  # "0.3333333" vs 1/3
    pa, pb = split_tuple(a), split_tuple(b)
    if pa or pb:
        return bool(pa and pb and pa[0] == pb[0] and pa[2] == pb[2] and len(pa[1]) == len(pb[1])
                    and all(math_equal(x, y) for x, y in zip(pa[1], pb[1])))
    if BASE.search(a) or BASE.search(b):
        return a == b
    ea, eb = parse_math(a), parse_math(b)
    if ea is None or eb is None:
        return False
    return bool(timed(lambda: _verify(eb, ea), SYMPY_SECONDS))


def _verify(gold, predicted):
    from math_verify import verify
    if _differ_at_a_point(gold, predicted):
        return False
    # strict: "x + 1" is not "y + 1"; timeout off, as time_limit.timed bounds the call from any thread
    return verify(gold, predicted, strict=True, timeout_seconds=None)


def _differ_at_a_point(a, b):
    """Do two expressions take other values at one of three points? math-verify simplifies a - b for
    every pair that is not equal on sight (tens of milliseconds); a point settles most unequal pairs
    in well under one. Only a sure difference counts: more than math-verify's 6-place rounding."""
    import sympy
    if not (isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr)):
        return False
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    rng = random.Random(0)
    for _ in range(3 if symbols else 1):
        point = {s: rng.uniform(0.5, 2.5) for s in symbols}
        try:
            va, vb = complex(a.evalf(15, subs=point)), complex(b.evalf(15, subs=point))
        except (TypeError, ValueError, ArithmeticError):
            continue
        if cmath.isfinite(va) and cmath.isfinite(vb) and abs(va - vb) > 1e-6 * max(1.0, abs(vb)) + 1e-6:
            return True
    return False


def _terminates(x: Fraction):
    """Is x a finite decimal (its denominator has no prime factor but 2 and 5)?"""
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def _same_items(xs, ys):
    """Are two lists equal in any order (each item of xs matched to its own item of ys)?"""
    left = list(ys)
    for x in xs:
        j = next((j for j, y in enumerate(left) if math_equal(x, y)), None)
        if j is None:
            return False
        left.pop(j)
    return not left
