"""Plain-text pieces the readers share: the last \\boxed{} (MATH golds), a translation's line, the
marks around a value, how word answers compare."""

import re
import string


def last_boxed(text):
    """Content of the last top-level \\boxed{...} (or \\fbox), nested braces allowed; None if absent
    or cut off."""
    found, i = None, 0
    while True:
        m = re.compile(r"\\(?:boxed|fbox)").search(text, i)
        if not m:
            return found
        j = m.end()
        if not text.startswith("{", j):  # "\boxed 5"
            b = re.match(r"\s+([^\s$]+)", text[j:])
            found, i = (b.group(1) if b else found), j
            continue
        depth, end = 0, None
        for k in range(j, len(text)):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                end = k
                break
        if end is None:
            return found
        found, i = text[j + 1:end], end + 1


def strip_marks(s):
    """`s` without the spaces, bold stars, dollar signs and final period around it."""
    s = s.strip().strip("*").strip()
    s = re.sub(r"^\$+|\$+$", "", s).strip()
    return s.rstrip(".").strip()


# A plain number: "-3", "1,000", "2.5", ".5".
NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+"


def extract_translation(text):
    """The translation in a model's output: the first non-empty line after the last
    "Translation:" / "English:" marker, else the first non-empty line."""
    hits = list(re.finditer(r"(?i)\btranslation\b[^:\n]{0,40}:|\benglish\s*:", text))
    rest = text[hits[-1].end():] if hits else text
    for line in rest.splitlines():
        line = line.strip().strip("*").strip().strip('"“”').strip()
        if line:
            return line
    return None


def normalize_text(s):
    """How word answers compare: lower case, no punctuation, no articles, single spaces."""
    s = str(s).lower()
    s = "".join(ch for ch in s if ch not in string.punctuation)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())
