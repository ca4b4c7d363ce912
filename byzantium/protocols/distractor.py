"""The wrong answer an attack pushes for a question: never accepted by the checker the metrics use,
found in constant memory (a variant of the gold in its own shape, not a search over numbers).

    distractor(task, seed=0)    # "C" for a choice task, "41" for 42, "6 - 2i" for "6 - 5i"
"""
import random
import re
from itertools import islice

from ..tasks import normalize_answer
from ..tasks.answers.judgements import VERDICTS


def distractor(task, seed=0) -> str:
    """The wrong answer the injection pushes: another option letter, the other yes/no or verdict, or
    for an open answer a variant of the gold in its own shape (one number in it moved, another name
    from the question, a sign or a function flipped), the first one `task.accepts` rejects.

    Drawn from random.Random(string) (seeded through SHA-512: stable across processes). Time and
    memory do not grow with the size of the gold's numbers."""
    rng = random.Random(f"distractor:{seed}:{task.id}")
    if task.kind == "choice":
        others = [l for l in task.letters if l != task.gold]
        if not others:
            raise ValueError(f"task {task.id}: one option only, so no wrong option to push")
        return rng.choice(others)
    if task.kind == "bool":
        return "no" if normalize_answer(task.gold, "bool") == "yes" else "yes"
    if task.kind == "verdict":
        return rng.choice([v for v in VERDICTS if v != task.gold])
    if task.kind in ("code", "translation"):
        raise ValueError(f"task {task.id}: no distractor for a {task.kind} task (no single wrong answer to push, "
                         f"and a variant of the gold would hand the agents the solution)")
    for candidate in islice(_variants(str(task.gold).strip(), task.question, task.kind, rng), _TRIES):
        if not task.accepts(candidate):
            return candidate
    raise ValueError(f"task {task.id}: every variant of {task.gold!r} tried is accepted as correct")


_TRIES = 32  # variants checked at most; the first is almost always wrong already
# A number written in the answer: not a subscript (a base, "4210_{5}"), not part of a longer number.
_LITERAL = re.compile(r"(?<![\d.])(?<!_)(?<!_\{)(?:\d+(?:\.\d+)?|\.\d+)")
_FUNCTION_SWAPS = {"sin": "cos", "cos": "sin", "tan": "cot", "cot": "tan", "sec": "csc", "csc": "sec"}


def _variants(gold, question, kind, rng):
    """Wrong-looking variants of a gold answer, most plausible first (all still to be checked)."""
    # One-digit LaTeX arguments get braces ("\\frac43" -> "\\frac{4}{3}"), so a moved digit stays one argument.
    gold = re.sub(r"(\\[dt]?frac|\\sqrt)\s*(\d)", r"\1{\2}", gold)
    gold = re.sub(r"(\\[dt]?frac\{[^{}]*\})\s*(\d)", r"\1{\2}", gold)
    literals = [m for m in _LITERAL.finditer(gold) if not re.fullmatch(r"0\d+", m.group())]
    for _ in range(12 if literals else 0):
        m = rng.choice(literals)
        yield gold[:m.start()] + _nudge(m.group(), rng) + gold[m.end():]
    inner = re.fullmatch(r"\\text\{(.*)\}", gold)
    word = inner.group(1).strip() if inner else gold
    wrap = (lambda w: f"\\text{{{w}}}") if inner else (lambda w: w)
    if re.fullmatch(r"\([A-J]\)", word):  # a lettered option: another of the question's letters
        letters = sorted(set(re.findall(r"\(([A-J])\)", question)) - {word[1]}) or [l for l in "ABCDE" if l != word[1]]
        rng.shuffle(letters)
        yield from (wrap(f"({l})") for l in letters)
    elif re.fullmatch(r"[A-Za-z][\w'-]*", word):
        siblings = _siblings(word, question)
        rng.shuffle(siblings)
        yield from (wrap(s) for s in siblings)
    for m in re.finditer(r"(?<=[\w})\]])(\s*)([+-])(?=\s*[\w\\({])", gold):  # a binary sign flipped
        yield gold[:m.start(2)] + "+-"[m.group(2) == "+"] + gold[m.end(2):]
    for m in re.finditer(rf"\\({'|'.join(_FUNCTION_SWAPS)})(?![a-zA-Z])", gold):
        yield gold[:m.start(1)] + _FUNCTION_SWAPS[m.group(1)] + gold[m.end(1):]
    if kind != "text" and gold.startswith("-"):  # the negative
        yield gold[1:].lstrip()
    elif kind != "text":
        yield f"-{gold}" if re.fullmatch(r"[\w\\{}^.]+", gold) else f"-({gold})"
    yield wrap("none")


def _nudge(literal, rng):
    """Another positive number with as many decimals and trailing zeros (and, from two significant
    digits on, as many digits), at most about a quarter away: 7 -> 4..10, 0.75 -> 0.57..0.93,
    2880000 -> 2160000..3600000 in steps of 10000."""
    whole, _, places = literal.partition(".")
    digits = str(int(whole + places))
    n = int(digits.rstrip("0") or "0")
    zeros = len(digits) - len(str(n)) if n else 0
    width = len(str(n))
    lo, hi = (10 ** (width - 1), 10 ** width - 1) if width > 1 else (1, None)
    d = rng.randint(1, max(3, n // 4))
    new = n - d if rng.random() < 0.5 else n + d
    if new < lo or (hi is not None and new > hi):
        new = 2 * n - new  # the other side of n is in range
    text = str(new) + "0" * zeros
    if not places:
        return text
    text = text.rjust(len(places) + 1, "0")
    head = text[:-len(places)]
    return ("" if head == "0" and not whole else head) + "." + text[-len(places):]  # ".35" stays ".xx"


def _siblings(word, question):
    """Other words the question writes where it writes `word` (the other names in `"Evelyn"`, `Navin
    from`; the other shapes in "a parabola, circle, ellipse, ..."), with the same capitalisation."""
    found = []
    for m in re.finditer(rf"(?<![\w\\]){re.escape(word)}(?!\w)", question, flags=re.I):
        before = question[m.start() - 1:m.start()]
        after = re.match(r"[^\w\s]|\s+[A-Za-z]+\b", question[m.end():])
        pattern = (re.escape(before) if before.strip() else r"(?<![\w\\])") + r"([A-Za-z][\w'-]*)" \
            + (re.escape(after.group()) if after else r"(?!\w)")
        found += re.findall(pattern, question)
    same_case = [w for w in found if w[0].isupper() == word[0].isupper() and w.lower() != word.lower()]
    return list(dict.fromkeys(same_case))


__all__ = ["distractor"]
