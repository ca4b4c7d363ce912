"""LaTeX and plain maths answers as sympy expressions, by latex2sympy2_extended (the parser of
Hugging Face's math-verify), behind a guard: an answer from an adversarial agent can ask for a
computation no time limit can interrupt (a power tower or a huge factorial is one C call that holds
the interpreter), so such answers are never parsed; they still match their own spelling."""

import functools
import re

from .time_limit import SYMPY_SECONDS, timed

# Names that are maths, not words: "3 sin x" and "2 pi" are not "3" and "2" with a unit word.
MATH_NAMES = set("sqrt log ln exp sin cos tan cot sec csc arcsin arccos arctan asin acos atan pi infty oo cdot times "
                 "div frac alpha beta gamma delta epsilon theta lambda mu phi omega sigma tau".split())

MAX_CHARS = 300
MAX_EXPONENT = 1000
MAX_SYMBOLIC_EXPONENT = 100


def parse_math(s):
    """Sympy expression (or Matrix) for a normalised answer, or None: not maths (a word such as
    "Evelyn"), unparsable, too costly to evaluate safely, or over the time limit."""
    if not s or len(s) > MAX_CHARS or _too_costly(s) or _is_words(s):
        return None
    import_libraries()
    return timed(lambda: _parse(s), SYMPY_SECONDS)


def import_libraries():
    """Import the parser and verifier outside any time limit: the first import takes most of a second,
    and one interrupted by the alarm leaves a module half-initialised for the rest of the process."""
    import latex2sympy2_extended  # noqa: F401
    import math_verify  # noqa: F401


@functools.lru_cache(maxsize=4096)  # here, not around the time limit: a parse cut short is not remembered
def _parse(s):
    import sympy
    from latex2sympy2_extended import NormalizationConfig, latex2sympy
    from latex2sympy2_extended.latex2sympy2 import ConversionConfig
    from math_verify.grader import should_treat_as_complex
    # Units stay ours (units.py's whitelist; the library's list drops "k" and "million"), and case
    # counts ("x" is not "X"; word answers are told apart by _is_words before this).
    normalization = NormalizationConfig(basic_latex=True, units=False, malformed_operators=True, nits=True,
                                        boxed="all", equations=False)
    try:
        expr = latex2sympy(s, is_real=not should_treat_as_complex(s), normalization_config=normalization,
                           conversion_config=ConversionConfig(lowercase_symbols=False))
    except Exception:  # anything unparsable is simply not an expression
        return None
    return expr if isinstance(expr, (sympy.Basic, sympy.MatrixBase)) else None


def _too_costly(s):
    """Towers of powers, exponents over MAX_EXPONENT, factorials of more than a small literal and
    40-digit numbers: values sympy would compute exactly, for minutes, in one uninterruptible call."""
    if (re.search(r"\d{40}", s) or "**" in s or re.search(r"\^\s*\d+\s*\^", s)
            or re.search(r"\^\s*\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\^", s)):  # a tower: an exponent with a power in it
        return True
    # Symbolic powers expand slowly ((x+1)^{2000}: seconds of simplify), numeric ones do not.
    limit = MAX_SYMBOLIC_EXPONENT if re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", s)) else MAX_EXPONENT
    for m in re.finditer(r"\^\s*(?:\{([^{}]*)\}|(\d+|\S))", s):
        exponent = (m.group(1) or m.group(2)).strip()
        if re.search(r"\d{5}", exponent) or (re.fullmatch(r"-?\d+(?:\.\d+)?", exponent) and abs(float(exponent)) > limit):
            return True
    return any(not re.search(r"(?<![\d.])\d{1,3}$", s[:m.start()]) for m in re.finditer(r"!", s)) or "!!" in s


def _is_words(s):
    """A word answer ("Evelyn", "odd and even"), not a product of one-letter symbols: any word of
    three letters or more that is no maths name, once LaTeX commands and environments are gone."""
    bare = re.sub(r"\\(?:begin|end)\{\w+\}|\\[A-Za-z]+", " ", s)
    return any(len(w) > 2 and w not in MATH_NAMES for w in re.findall(r"[A-Za-z]+", bare))
