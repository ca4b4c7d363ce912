"""Reading what a reply states: its last \\boxed{}, what follows "The answer is", the number in a
candidate, a translation's line; and the plain-text pieces the other readers share."""

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


def answer_line(text):
    """What follows the last 'answer is' / 'Answer:' marker, up to the end of its sentence."""
    hits = list(re.finditer(r"(?i)\banswer\s*(?:is|:|=)\s*:?", text))
    if not hits:
        return None
    rest = text[hits[-1].end():].split("\n")[0] + " "
    ends = [m.start() for m in re.finditer(r"\.\s", rest) if not _ABBREVIATION.search(rest[:m.start()])]
    return strip_marks(rest[:ends[0]] if ends else rest) or None


_ABBREVIATION = re.compile(r"\b(?:Mt|Rs|Dr|Mr|Mrs|Ms|St|Jr|Sr|vs|approx|etc|e\.g|i\.e)$")  # "Rs. 750" is one answer


def strip_marks(s):
    """`s` without the spaces, bold stars, dollar signs and final period around it."""
    s = s.strip().strip("*").strip()
    s = re.sub(r"^\$+|\$+$", "", s).strip()
    return s.rstrip(".").strip()


# A plain number: "-3", "1,000", "2.5", ".5".
NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+"


def number_in(s):
    """The number a candidate states: right of its last '=', first number there, commas dropped."""
    if s is None:
        return None
    s = s.split("=")[-1]
    # An expression ("30 \\times 2") is not its first number; unevaluated, it states no number.
    if re.search(r"\d\s*(?:\\times|\\cdot|[*×+])\s*-?\d", s):
        return None
    s = re.sub(r"\\frac\{(-?\d+)\}\{(\d+)\}", r"\1/\2", s)
    m = re.search(rf"({NUMBER})(?:\s*/\s*(\d+))?", s)
    if not m:
        return None
    num = m.group(1).replace(",", "")
    num = f"{num}/{m.group(2)}" if m.group(2) else num
    # A letter stuck to it makes another value ("2k", "5i", "2x"), unless it is a unit symbol ("5m").
    letter = re.match(r"[a-zA-Z](?![a-zA-Z])", s[m.end():])
    return num + letter.group() if letter and letter.group() not in "mshglMSHGL" else num


def last_number(text):
    """The last plain number in `text`, commas dropped."""
    nums = re.findall(NUMBER, text)
    return nums[-1].replace(",", "") if nums else None


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
