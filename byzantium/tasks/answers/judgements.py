"""The canonical words of yes/no answers and pairwise verdicts ("win" = Assistant 1 is better, "lose" =
Assistant 2 is better, "tie"), for normalize_answer; replies are read by the conclusion reader."""

import re

VERDICTS = ("win", "lose", "tie")

BOOL_WORDS = {"yes": "yes", "true": "yes", "no": "no", "false": "no",
              "entailment": "yes", "not entailment": "no", "not_entailment": "no", "entails": "yes"}
# Pairwise judgements: the words that name each verdict.
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
