"""LaTeX answers as sympy expressions, safely: a small converter to sympy-parsable text (sympy's own
LaTeX parser needs an exact antlr4 runtime version), only whitelisted names reach `parse_expr`, and
parsing runs under the sympy time limit."""

import functools
import re
import string

from .time_limit import SYMPY_SECONDS, timed


_FUNCS = {"sqrt", "log", "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "exp", "pi", "oo"}
_GREEK = {"alpha", "beta", "gamma", "delta", "theta", "lambda", "mu", "phi", "omega", "sigma", "tau"}
MATH_NAMES = _FUNCS | _GREEK
LATEX_COMMANDS = {"pi": "pi", "infty": "oo", "cdot": "*", "times": "*", "div": "/", "ln": "log", "log": "log",
                  "arcsin": "asin", "arccos": "acos", "arctan": "atan",
                  **{f: f for f in ("sin", "cos", "tan", "cot", "sec", "csc", "exp")}, **{g: g for g in _GREEK}}


@functools.lru_cache(maxsize=4096)
def parse_math(s):
    """Sympy expression for a normalised answer, or None (unknown LaTeX, unsafe or too big)."""
    try:
        text = _tex_to_text(s)
    except ValueError:
        return None
    if not re.fullmatch(r"[0-9a-zA-Z+\-*/().\s]*", text) or not text.strip() or len(text) > 300:
        return None
    # Two-letter names are products ("xy" -> "x*y"); longer unknown words are not math.
    words = re.findall(r"[A-Za-z]+", text)
    if any(len(w) > 2 and w not in MATH_NAMES for w in words):
        return None
    text = re.sub(r"[A-Za-z]+", lambda m: m.group(0) if m.group(0) in MATH_NAMES else "*".join(m.group(0)), text)
    if (re.search(r"\d{40}", text) or re.search(r"\*\*[^+\-*/]*\*\*", text)  # no towers of powers
            or any(_too_big(e) for e in re.findall(r"\*\*\s*\(?([\d.]+)", text))):
        return None
    _import_sympy()
    return timed(lambda: _parse_expr(text), SYMPY_SECONDS)


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
            if not m or m.group(1) not in LATEX_COMMANDS:
                raise ValueError(f"unsupported LaTeX at {s[i:i + 12]!r}")
            out.append(f" {LATEX_COMMANDS[m.group(1)]} ")
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
