"""Are two numeric or MATH answers equal? Two plain decimals exactly, a number without an exact
decimal form within REL_TOL, sets in any order, expressions by sympy (spot checks, then simplify)."""

import math
from fractions import Fraction

from .latex import parse_math
from .math_form import to_fraction
from .structure import matrix_rows, solutions, split_tuple
from .time_limit import SYMPY_SECONDS, timed

REL_TOL = 1e-6


def math_equal(a, b):
    sa, sb = solutions(a), solutions(b)
    if sa is not None or sb is not None:  # a one-item set is its item: "\{5\}" is "5"
        return _same_items(sa if sa is not None else [a], sb if sb is not None else [b])
    ma, mb = matrix_rows(a), matrix_rows(b)
    if ma is not None or mb is not None:
        return bool(ma and mb and [len(r) for r in ma] == [len(r) for r in mb]
                    and all(math_equal(x, y) for ra, rb in zip(ma, mb) for x, y in zip(ra, rb)))
    xa, xb = to_fraction(a), to_fraction(b)
    if xa is not None and xb is not None:
        if _terminates(xa) and _terminates(xb):  # two decimals: equal exactly ("1450001" is not 1450000)
            return xa == xb
        return math.isclose(float(xa), float(xb), rel_tol=REL_TOL, abs_tol=1e-12)  # "0.3333333" vs 1/3
    pa, pb = split_tuple(a), split_tuple(b)
    if pa or pb:
        return bool(pa and pb and pa[0] == pb[0] and pa[2] == pb[2] and len(pa[1]) == len(pb[1])
                    and all(math_equal(x, y) for x, y in zip(pa[1], pb[1])))
    if a.count("=") == 1 and b.count("=") == 1:  # equations: same sides
        return all(math_equal(x, y) for x, y in zip(a.split("="), b.split("=")))
    ea, eb = parse_math(a), parse_math(b)
    if ea is None or eb is None:
        return False
    return bool(timed(lambda: _sympy_equal(ea, eb), SYMPY_SECONDS))


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


def _same_items(xs, ys):
    """Are two lists equal in any order (each item of xs matched to its own item of ys)?"""
    left = list(ys)
    for x in xs:
        j = next((j for j, y in enumerate(left) if math_equal(x, y)), None)
        if j is None:
            return False
        left.pop(j)
    return not left
