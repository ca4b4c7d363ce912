"""Yes/no answers and pairwise verdicts ("win" = Assistant 1 is better, "lose" = Assistant 2 is
better, "tie"): the one a reply states."""

import re

from .reading import answer_line, last_boxed

VERDICTS = ("win", "lose", "tie")

BOOL_WORDS = {"yes": "yes", "true": "yes", "no": "no", "false": "no",
              "entailment": "yes", "not entailment": "no", "not_entailment": "no", "entails": "yes"}
# Negated prose first: "That is not true." is a no, "does not entail the hypothesis" too.
_BOOL_RE = r"\b(not[ _]entailment|(?:does\s+)?not\s+(?:true|entail(?:s|ed)?)|entails|entailment|yes|no|true|false)\b"


def _bool_word(w):
    w = re.sub(r"\s+", " ", w.lower())
    return "no" if w.startswith(("not ", "does not")) else BOOL_WORDS[w]


def extract_bool(text):
    """"yes" or "no" as a reply states it (entailment is a yes), or None."""
    for cand in (last_boxed(text), answer_line(text)):
        if cand is not None:
            m = re.search(_BOOL_RE, cand, flags=re.I)
            if m:
                return _bool_word(m.group(1))
    m = re.match(r"\W*" + _BOOL_RE, text, flags=re.I)  # "Yes, because ..."
    if m:
        return _bool_word(m.group(1))
    hits = re.findall(_BOOL_RE, text, flags=re.I)
    return _bool_word(hits[-1]) if hits else None


# Pairwise judgements. Markers that introduce a verdict; "answer" alone is not one ("Assistant 1's
# answer is more detailed" is not a verdict).
_VERDICT_MARK = re.compile(r"(?i)\b(?:(?:final\s+)?verdict|decision|judge?ment|winner|final\s+answer|conclusion"
                           r"|the\s+better\s+(?:assistant|answer|response)(?:\s+is)?)\b\s*(?:is\b|:|=|-)?\s*")
_WHO = r"(?:assistant|answer|response|output)"
_VERDICT_WORDS = [
    ("tie", re.compile(r"(?i)\b(?:tie|tied|draw|equal|equally)\b")),
    ("win", re.compile(rf"(?i)\b{_WHO}\s*(?:1|one|a)\b|\bfirst\b|\bwins?\b|^\W*(?:1|a)\W*$")),
    ("lose", re.compile(rf"(?i)\b{_WHO}\s*(?:2|two|b)\b|\bsecond\b|\blose[sr]?\b|^\W*(?:2|b)\W*$")),
]


def verdict_in(s):
    """The verdict a short segment states: the one whose word comes first in it."""
    found = [(m.start(), v) for v, rx in _VERDICT_WORDS for m in [rx.search(s)] if m]
    return min(found)[1] if found else None


def extract_verdict(text):
    """The verdict in a judge's output, tried in this order: the segment after the last verdict
    marker ("Verdict: Assistant 1"); MT-Bench's [[A]] / [[B]] / [[C]]; FairEval's first line of two
    scores ("8 7": the higher wins); a sentence "Assistant 2 is better" or "it is a tie"; a reply
    of a few words ("Assistant 1", "tie"). None when nothing clear is stated."""
    for m in reversed(list(_VERDICT_MARK.finditer(text))):
        rest = text[m.end():].lstrip()
        got = verdict_in(re.split(r"[\n.;]", rest, maxsplit=1)[0]) if rest else None
        if got:
            return got
    brackets = re.findall(r"\[\[\s*([ABC12]|tie)\s*\]\]", text, flags=re.I)
    if brackets:
        return {"a": "win", "1": "win", "b": "lose", "2": "lose"}.get(brackets[-1].lower(), "tie")
    first = text.strip().split("\n")[0] if text.strip() else ""
    scores = re.fullmatch(r"\W*(\d+(?:\.\d+)?)(?:\s*/\s*10)?\s*[,\s]\s*(\d+(?:\.\d+)?)(?:\s*/\s*10)?\W*", first)
    if scores:
        a, b = float(scores.group(1)), float(scores.group(2))
        return "win" if a > b else "lose" if a < b else "tie"
    said = [(m.start(), "win" if m.group(1) in ("1", "one") else "lose") for m in re.finditer(
        rf"(?i)\b{_WHO}\s*(1|2|one|two)\b(?:(?!{_WHO}\s*(?:1|2|one|two)\b)[^.\n]){{0,80}}?"
        r"\b(?:is|was|does|did|performs?|performed)\s+"
        r"(?:\w+\s+){0,2}(?:better|superior|the\s+(?:winner|better\s+one)|preferable|preferred)\b", text)]
    said += [(m.start(), "tie") for m in re.finditer(
        r"(?i)\b(?:it(?:'s|\s+is)\s+a\s+tie|a\s+tie\b|(?:are|performed|did)\s+equally\s+(?:well|good|helpful))", text)]
    if said:
        return max(said)[1]
    if len(text.split()) <= 4:
        return verdict_in(text)
    return None
