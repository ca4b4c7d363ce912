"""Answers made of parts: sets and bare lists of solutions (unordered multisets), "\\pm" pairs, tuples,
points and intervals (ordered). Matrices are math-verify's (math_equal.py)."""

import re


def solutions(s):
    """Items of an unordered answer, or None. Unordered: a set ("\\{1,2\\}", or "{1,2}", which LaTeX
    prints as 1, 2), a bare list of solutions ("-1,3", "x=3,x=-1") and a "\\pm" ("1\\pm\\sqrt{19}" is
    two roots). Bracketed lists are ordered: tuples, points "(1,2)", intervals "[2,5)"."""
    m = re.fullmatch(r"\\\{(.*)\\\}", s) or re.fullmatch(r"\{(.*)\}", s)
    if m and _balanced(m.group(1)):
        items = _top_split(m.group(1))
    elif split_tuple(s) and not split_tuple(s)[0]:
        items = split_tuple(s)[1]
    elif s.count("\\pm") == 1:
        items = [s]
    else:
        return None
    names = {re.match(r"[a-zA-Z]=|", x).group() for x in items}
    if len(names) == 1:  # "x=3,x=-1" names one unknown: its values ("x=3,y=4" keeps its names)
        items = [x[len(next(iter(names))):] for x in items]
    return [y for x in items for y in _pm(x)]


def _pm(s):
    """'a\\pmb' -> ['a+b', 'a-b']: the two values it stands for; other items unchanged."""
    if s.count("\\pm") != 1:
        return [s]
    a, b = s.split("\\pm")
    return [f"{a}+{b}", f"{a}-{b}"]


# A number in another base: "204_5" ("204_{5}" once normalised)
BASE = re.compile(r"\d_\w")


def split_tuple(s):
    """'(1,2]' -> ('(', ['1', '2'], ']'); plain top-level comma lists get empty brackets."""
    left, right, inner = "", "", s
    if len(s) >= 2 and s[0] in "([{" and s[-1] in ")]}" and _balanced(s[1:-1]):
        left, right, inner = s[0], s[-1], s[1:-1]
    parts = _top_split(inner)
    return (left, parts, right) if len(parts) > 1 else None


def _top_split(s):
    """s split at its top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _balanced(s):
    depth = 0
    for ch in s:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            return False
    return depth == 0
