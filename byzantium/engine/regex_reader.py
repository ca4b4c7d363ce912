"""A regex read into a tree of code-point sets (regex_closing.py builds its automaton from it).

The syntax read is the common one (literals, classes, ".", groups, "|", quantifiers, the \\d \\w \\s
escapes) and the inline flags i, s, m, x (below); anything else (look-around, \\b, \\p{..}) raises
Unsupported, and the regex gets no closing.

Flags are read as the grammar engine (llguidance, Rust's regex syntax) reads them: `(?flags)` at the start,
or anywhere for the rest of its group, and `(?flags:...)` for a group alone, `-` turning flags off.
i: a literal or class also matches its other-case forms, by simple case folding only (each character to
one character; str.casefold, else str.lower, on single characters, so "ß" is not "ss"); \\d \\w \\s keep their
sets. s: "." matches a newline too. m is read, but a ^ or $ under it is refused: the grammar engine
refuses it too (it would be a look-around there), so no request carries one. x: spaces and a # comment
to the pattern's end are skipped; a tab or newline is refused, as the grammar engine reads it as itself
(and a comment on past a newline), and so is whitespace or # in a class (Rust skips it there, Python's
re does not). U (lazy and greedy swapped) and u (Unicode, on already) change no match.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import lru_cache

MAX_CODE = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
ANY_BUT_NEWLINE = ((0, 9), (11, MAX_CODE))
ANYTHING = ((0, MAX_CODE),)
EMPTY = ("cat", [])
DIGIT = ((48, 57),)
WORD = ((48, 57), (65, 90), (95, 95), (97, 122))
SPACE = ((9, 13), (32, 32))
CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
PREFERRED = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # what a closing writes, first
FLAGS = "imsxuU"  # the inline flags read (the module's docstring says how)
CASED_BELOW = 0x20000  # no character from plane 2 up has another case


class Unsupported(ValueError):
    """Syntax this reader does not take: the regex gets no closing."""


# -- code-point sets: sorted, disjoint (lo, hi) ranges --------------------------------------------------------
def normalized(ranges):
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def complement(ranges):
    out, start = [], 0
    for lo, hi in normalized(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE:
        out.append((start, MAX_CODE))
    return tuple(out)


def contains(ranges, code):
    return any(lo <= code <= hi for lo, hi in ranges)


def smallest_in(ranges, low=0, high=MAX_CODE):
    """The smallest code point of `ranges` in [low, high] that is a character (not a surrogate), or None."""
    for lo, hi in ranges:
        code = max(lo, low)
        if SURROGATES[0] <= code <= SURROGATES[1]:
            code = SURROGATES[1] + 1
        if code <= min(hi, high):
            return code
    return None


def simple_fold(char):
    """The character `char` folds to, by simple case folding: one character to one."""
    for folded in (char.casefold(), char.lower()):
        if len(folded) == 1:
            return folded
    return char


@lru_cache(maxsize=1)
def case_partners():
    """The code points that have other-case forms (sorted), and for each the code points of its case
    (itself included): those that fold to the same character. Built on first use of (?i)."""
    cases = {}
    for code in range(CASED_BELOW):
        cases.setdefault(simple_fold(chr(code)), []).append(code)
    partners = {code: codes for codes in cases.values() if len(codes) > 1 for code in codes}
    return sorted(partners), partners


def case_closed(ranges):
    """`ranges` with every other-case form of their characters."""
    cased, partners = case_partners()
    out = list(ranges)
    for lo, hi in ranges:
        for code in cased[bisect_left(cased, lo):bisect_right(cased, hi)]:
            out.extend((other, other) for other in partners[code])
    return normalized(out)


def representative(ranges):
    """The character a closing writes for a set: a digit or letter if it has one, else printable ASCII."""
    for char in PREFERRED:
        if contains(ranges, ord(char)):
            return char
    code = smallest_in(ranges, 0x20, 0x7E)
    code = smallest_in(ranges) if code is None else code
    return None if code is None else chr(code)


# -- the regex, read into a tree ------------------------------------------------------------------------------
class Reader:
    """A recursive-descent reader of a regex into ("set", ranges), ("cat", [..]), ("alt", [..]) and
    ("rep", node, least, most or None) nodes. `flags` are the inline flags in force where it reads."""

    def __init__(self, text):
        self.text, self.pos, self.flags = text, 0, frozenset()

    def peek(self, k=0):
        return self.text[self.pos + k] if self.pos + k < len(self.text) else None

    def take(self):
        char = self.text[self.pos]
        self.pos += 1
        return char

    def parse(self):
        node = self.alternation()
        if self.pos != len(self.text):
            raise Unsupported(f"unexpected {self.peek()!r} at {self.pos}")
        return node

    def skip_verbose(self):
        """Under (?x): past spaces and a # comment (to the pattern's end)."""
        while "x" in self.flags and self.peek() is not None:
            if self.peek() == "#":
                if "\n" in self.text[self.pos:]:  # the grammar engine's comment runs on past it
                    raise Unsupported("a (?x) comment ended by a newline")
                self.pos = len(self.text)
            elif self.peek() == " ":
                self.take()
            elif self.peek().isspace():  # the grammar engine reads a tab or newline as itself, Python skips it
                raise Unsupported("whitespace other than a space in a (?x) pattern")
            else:
                return

    def alternation(self):
        options = [self.concatenation()]
        while self.peek() == "|":
            self.take()
            options.append(self.concatenation())
        return options[0] if len(options) == 1 else ("alt", options)

    def concatenation(self):
        items = []
        self.skip_verbose()
        while self.peek() is not None and self.peek() not in "|)":
            items.append(self.repetition())
            self.skip_verbose()
        return ("cat", items)

    def repetition(self):
        node = self.atom()
        self.skip_verbose()
        while self.peek() is not None and self.peek() in "*+?{":
            char = self.take()
            if char == "{":
                least, most = self.counts()
            else:
                least, most = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
            if self.peek() == "?":  # lazy: the same language
                self.take()
            node = ("rep", node, least, most)
            self.skip_verbose()
        return node

    def counts(self):
        end = self.text.find("}", self.pos)
        if end < 0:
            raise Unsupported("an unclosed {")
        body, self.pos = self.text[self.pos:end], end + 1
        least, comma, most = body.partition(",")
        if not least or any(char not in "0123456789" for char in least + most):  # "{1, 2}": not a repeat
            raise Unsupported(f"a repeat count {{{body}}}")
        least = int(least)
        most = least if not comma else (int(most) if most else None)
        if most is not None and most < least:
            raise Unsupported(f"a repeat count {{{body}}}")
        return least, most

    def atom(self):
        char = self.take()
        if char == "(":
            return self.group()
        if char == "[":
            return ("set", self.char_class())
        if char == ".":
            return ("set", ANYTHING if "s" in self.flags else ANY_BUT_NEWLINE)
        if char in "^$":  # the whole output matches: the anchors add nothing
            if "m" in self.flags:  # a line's: the grammar engine refuses it (a look-around to it)
                raise Unsupported(f"a (?m) {char}")
            return EMPTY
        if char == "\\":
            code, ranges = self.escape()
            return ("set", ranges if code is None else self.cased([(code, code)]))
        if char in "*+?{)":
            raise Unsupported(f"a {char!r} with nothing to repeat")
        return ("set", self.cased([(ord(char), ord(char))]))

    def group(self):
        """After a "(": the group, or nothing for a (?flags) (which holds for the rest of its group)."""
        outer = self.flags
        if self.peek() == "?":
            self.take()
            if self.peek() == ":":
                self.take()
            elif self.peek() == "P" and self.peek(1) == "<" or self.peek() == "<" and self.peek(1) not in ("=", "!"):
                end = self.text.find(">", self.pos)
                if end < 0:
                    raise Unsupported("an unclosed group name")
                self.pos = end + 1
            else:
                self.flags = self.flag_change()
                if self.take() == ")":
                    return EMPTY
        node = self.alternation()
        if self.peek() != ")":
            raise Unsupported("an unclosed group")
        self.take()
        self.flags = outer
        return node

    def flag_change(self):
        """The flags after the letters of a (?flags) or (?flags:, up to its ")" or ":" (not taken)."""
        on, off, start = set(), set(), self.pos
        letters = on
        while self.peek() is not None:
            if self.peek() in FLAGS:
                letters.add(self.take())
            elif self.peek() == "-" and letters is on:
                self.take()
                letters = off
            else:
                break
        if self.peek() not in (":", ")") or not on | off or letters is off and not off or on & off:
            raise Unsupported(f"the group (?{self.text[start:self.pos + 1]}: look-around or unknown flags")
        if "u" in off:
            raise Unsupported("(?-u): bytes, not characters")
        return (self.flags | on) - off

    def cased(self, ranges):
        """A set of literal characters: with their other-case forms under (?i)."""
        return case_closed(ranges) if "i" in self.flags else normalized(ranges)

    def escape(self):
        """(the code point, None) of a character escape, or (None, its set) of a class escape (after the
        backslash), in or out of a class. A class escape's set keeps its case under (?i), as the grammar's."""
        if self.peek() is None:
            raise Unsupported("a trailing backslash")
        char = self.take()
        if "x" in self.flags and char.isspace() and char != " ":
            raise Unsupported("an escaped tab or newline in a (?x) pattern")
        if char.lower() in CLASS_ESCAPES:
            ranges = CLASS_ESCAPES[char.lower()]
            return None, complement(ranges) if char.isupper() else ranges
        if char in CHAR_ESCAPES:
            code = ord(CHAR_ESCAPES[char])
        elif char in "xu":
            code = self.hex_code(char)
        elif char.isalnum():
            raise Unsupported(f"the escape \\{char}")
        else:
            code = ord(char)
        return code, None

    def hex_code(self, kind):
        if self.peek() == "{":
            end = self.text.find("}", self.pos)
            if end < 0:
                raise Unsupported(f"an unclosed \\{kind}{{")
            digits, self.pos = self.text[self.pos + 1:end], end + 1
        else:
            width = 2 if kind == "x" else 4
            digits, self.pos = self.text[self.pos:self.pos + width], self.pos + width
        try:
            code = int(digits, 16)
        except ValueError:
            raise Unsupported(f"the escape \\{kind}{digits}") from None
        if code > MAX_CODE:
            raise Unsupported(f"the escape \\{kind}{digits}")
        return code

    def char_class(self):
        negated = self.peek() == "^"
        if negated:
            self.take()
        literals, escaped, first = [], [], True
        while True:
            char = self.peek()
            if char is None:
                raise Unsupported("an unclosed [")
            if char == "]" and not first:
                self.take()
                break
            if char == "[":
                raise Unsupported("a nested class or a POSIX class")
            if "x" in self.flags and (char == "#" or char.isspace()):
                raise Unsupported("whitespace or # in a class under (?x)")
            first = False
            code, ranges = self.class_item()
            if code is None:
                escaped.extend(ranges)
            elif self.peek() == "-" and self.peek(1) not in ("]", None):
                self.take()
                end, _ = self.class_item()
                if end is None or end < code:
                    raise Unsupported("a class range")
                literals.append((code, end))
            else:
                literals.append((code, code))
        ranges = normalized(list(self.cased(literals)) + escaped)  # folded before it is negated, as the grammar's
        return complement(ranges) if negated else ranges

    def class_item(self):
        """(code point, None) of a class's character, or (None, set) of a class escape in it."""
        char = self.take()
        if char == "\\":
            return self.escape()
        if char == "&" and self.peek() == "&" or char in "~-" and self.peek() == char:
            raise Unsupported("a class operation")
        return ord(char), None


