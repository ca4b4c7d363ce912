"""The one conclusion reader: what a reply commits to, for every answer kind.

    read_conclusion(text, values) -> Reading(value, status)

A reply commits to an answer in a few kinds of statement: a marker followed by a value ("Answer: C",
"**Final answer** - 42", "The correct choice is (B)", "I'd go with C", "so the verdict is a tie",
"Confidence level: 0.8", "#### 72"), a boxed or bolded value (\\boxed{5}, **C**, \\textbf{C}), a value
said to be right ("(B) is correct"), and a closing line that is only a value. The reader finds every
commitment and takes the LAST one, so a later correction beats an earlier boxed value.

Negation and refutation are honoured inside a commitment and after it: "The answer is not 1250; it is
1300." commits to 1300, "B, not C" to B, "rather than X" refutes X, and a committed value that a later
sentence refutes ("(C) cannot be right") leaves the reply with no answer. For a two-valued kind (yes/no)
a refuted value commits to the other ("The answer is not yes." is a no). A commitment to two different
values joined by "or" ("(C) or (D)", "either 12 or 14") is ambiguous: it reads nothing and says so.

Each kind supplies only what its values look like (`find`: the values in a piece of text, with their
spans) and how two values compare (`same`); see kinds.py. The text is cleaned first: <think> blocks
dropped, Unicode digits, minus signs and spaces made plain.
"""

import re
import unicodedata
from collections import deque
from dataclasses import dataclass

READ, UNREAD, AMBIGUOUS = "read", "unread", "ambiguous"


@dataclass(frozen=True)
class Reading:
    """What a reply commits to: `value` (None unless status is "read") and how it was read; for an
    ambiguous reading, `said` is the text that names the alternatives ("6 or 12")."""
    value: object
    status: str
    said: str | None = None

    @property
    def read(self):
        return self.status == READ


NOTHING = Reading(None, UNREAD)

# ------------------------------------------------------------------ cleaning


def strip_think(text):
    """`text` without <think>...</think> blocks, in linear time; an unclosed block runs to the end (all
    working, no conclusion)."""
    out, i = [], 0
    while True:
        start = text.find("<think>", i)
        if start < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:start])
        end = text.find("</think>", start)
        if end < 0:
            return "".join(out)
        i = end + len("</think>")


_MINUS = dict.fromkeys(map(ord, "\u2212\u2012\u2013\ufe63\uff0d"), "-")
_THIN_SPACE_THOUSANDS = re.compile(r"(?<=\d)[\u00a0\u2009\u202f](?=\d{3}(?!\d))")  # "1 375" (narrow no-break space)


def plain(text):
    """Unicode digits of any script as ASCII digits, minus signs as '-', odd spaces as ' ', full-width
    forms narrowed (NFKC keeps letters and LaTeX as they are)."""
    text = unicodedata.normalize("NFKC", _THIN_SPACE_THOUSANDS.sub(",", text)).translate(_MINUS)
    return "".join(str(unicodedata.decimal(ch)) if ch.isdecimal() and not ch.isascii() else ch for ch in text)


_DISPLAY = re.compile(r"\$\$[^$]{0,4000}?\$\$|\\\[.{0,4000}?\\\]", re.S)


def clean(text):
    """The text a reader reads: no <think> blocks, plain digits and signs, display maths on one line."""
    text = plain(strip_think(str(text or "")))
    text = re.sub(r"(?<!\w)__([^_\n]{1,80})__(?!\w)", r"**\1**", text)  # markdown's other bold: "__Score__:"
    return _DISPLAY.sub(lambda m: " ".join(m.group().split()), text)


# ------------------------------------------------------------------ statements that commit

# Words that introduce a committed answer. A bare "answer" must be followed by a copula or punctuation:
# "To answer this we need 3 steps" commits to nothing.
_ANSWER_NOUN = (r"(?:(?:final\s+|correct\s+|right\s+|best\s+|my\s+|the\s+|predicted\s+)*"
                r"(?:answer|choice|option|selection|verdict|decision|label|relation|classification|prediction|guess|pick)s?"
                r"|(?:(?:the|final|correct|my)\s+)+(?:total|result)|(?:result|total)(?=\s*:))"
                r"(?:\s+(?:here|then|therefore|thus|overall|now|in\s+this\s+case))?")
_COPULA = (r"(?:\s*\([^)\n]{0,20}\))?[*_ \t]*(?:(?:is|would\s+be|should\s+be|must\s+be|will\s+be|has\s+to\s+be|"
           r"appears\s+to\s+be|seems\s+to\s+be|remains|stands)\b\s*(?:as\s+)?:?|[:=\-\u2013\u2014])")
# (pattern, weak): a weak marker ("so", "probably") commits only to a clause that names one value.
# The concluding ones ("so", "therefore") count only at the end: "so the term is 3" in the working is no answer.
NOUN_MARKERS = [
    (rf"\b{_ANSWER_NOUN}{_COPULA}", False),
    (r"\b(?:final\s+)?answer(?=\s*[\[(])", False),  # "Answer (C)", "Answer: [C]"
    (r"(?m)^[#>*_\s]*(?:final\s+)?(?:answer|ans)\b[*_.\s]*(?=[(\[]?[A-Za-z0-9])", False),  # "Answer D" as AQuA's rationales end
    (r"####", False),
    # a heading, its answer on the next line: "## Correct answer\n\nB", "**Final choice**\n(C)"
    (r"(?m)^[#*_\s]*(?:final\s+|correct\s+|best\s+)?(?:answer|choice|option|verdict|label|relation)[*_:\s]*\n\s*", False),
]
CHOOSING_MARKERS = [
    (r"\b(?:I(?:'d|\s+would|'ll|\s+will|'m|\s+am)?\s+(?:go|going|stick|sticking|stay|staying)\s+with|"
     r"I(?:\s+would|\s+will|'d)?\s+(?:choose|pick|select|say|conclude)|my\s+pick\s+is)\b\s*:?", False),
    (r"\b(?:probably|most\s+likely|likely|I\s+(?:think|believe|guess|suspect)|on\s+balance|I\s+lean\s+towards?|"
     r"leaning\s+towards?|my\s+(?:best\s+)?guess(?=\s+is\b|\s*:)|(?:fairly|pretty|quite|reasonably)\s+(?:sure|confident)\s+(?:that\s+)?"
     r"(?:it(?:'s|\s+is)\s+)?)\b\s*:?", True),
] + [(r"\b(?:more\s+like|closer\s+to)\b", True)]
REVISING_MARKERS = CHOOSING_MARKERS[-1:]  # "not 45%; more like 30%"
CONCLUDING = "concluding"  # weak, and only on the reply's last line
CONCLUDING_MARKERS = [
    (r"=>|⇒|∴", CONCLUDING),
    (r"(?:^|(?<=[.!?;:,\n])|\band\b)\s*(?:so|thus|therefore|hence|consequently|overall|in\s+total|altogether)\b(?!\s+far\b),?",
     CONCLUDING),
]
ANSWER_MARKERS = NOUN_MARKERS + CHOOSING_MARKERS + CONCLUDING_MARKERS

_SENTENCE_END = re.compile(r"(?<!\b(?:Mt|Rs|rs|Dr|Mr|Ms|St|Jr|Sr|vs))(?<!\bMrs|\betc|\bapp)(?<!\\)[.!?](?=\s|$)"
                           r"|\n")
_CLAUSE_CUT = re.compile(r",?\s+(?:which|since|because|as\s+(?:it|this|the)|given|where|when|so\s+that|meaning|"
                         r"although|though|even\s+though|while|whereas|depending|unless|assuming)\b")

# After a value: it is being ruled out. Before a value: it is negated.
_REFUTED_AFTER = re.compile(
    r"^[)\]*_\s,\"'“”‘’]*(?:(?:is|are|was|seems|looks|would\s+be)\s+(?:(?:also|clearly|definitely|therefore)\s+)?"
    r"(?:wrong|incorrect|false|invalid|impossible|not\b|ruled\s+out|eliminated|excluded|out\b|a\s+trap|a\s+distractor)"
    r"|(?:cannot|can't|can\s+not|could\s+not|couldn't|must\s+not|doesn't|does\s+not|won't|will\s+not)\b"
    r"|(?:fails|is\s+too|isn't)\b)", re.I)
_NEGATED_BEFORE = re.compile(
    r"(?:\bnot|n't|\bnever|\bnor|\brather\s+than|\binstead\s+of|\bother\s+than|\bexcept|\bexcluding|\bno\s+longer"
    r"|\brule\s+out|\bruled\s+out|\beliminate|\bnot\s+(?:option|choice|answer))[\s*_(\[:\"'“”‘’]*"
    r"(?:(?:an?|the|option|choice|answer|the\s+answer)\s+)?[\s*_(\[\"'“”‘’]*$", re.I)
_OR_BETWEEN = re.compile(r"^[\s)\]*_,.\"'“”‘’]*(?:,?\s*or\b|/|\band/or\b|\band\b)[\s(\[*_\"'“”‘’]*(?:maybe\s+|possibly\s+|perhaps\s+)?", re.I)
_EITHER_BEFORE = re.compile(r"\b(?:either|between|both)\b[\s(\[*_\"'“”‘’]*$", re.I)
_AFFIRMED_AFTER = re.compile(
    r"^[)\]*_\s\"'“”‘’]*(?:as\s+(?:the|my)\s+(?:final\s+|correct\s+|right\s+)?"
    r"(?:answer|choice|option|verdict|total|result|score|rating|label|confidence)\b|"
    r"(?:is|must\s+be|seems|would\s+be)\s+(?:the\s+)?(?:(?:only\s+)?(?:correct|right|best|true|valid)\b"
    r"(?!\s+(?:only|if|when|for))|(?:correct|right|best|final)\s+(?:answer|option|choice|one)|the\s+answer\b))", re.I)


# "We may check our answer: 17 * 44 = 748": checking an answer is not stating one
_CHECKING = re.compile(r"\b(?:check|checking|verify|verifying|confirm|confirming|test|testing|double-check)\s+"
                       r"(?:(?:our|my|the|this|that)\s+)?$", re.I)


@dataclass(frozen=True)
class Found:
    start: int
    end: int
    value: object


SENTENCE_LIMIT = 400  # characters a committing sentence is read for: bounds the work on untrusted text
LAST = 64  # statements of each kind read, the last ones: the conclusion is at the end, and a text of
           # thousands of "The answer is" costs no more than one of 64


def _last(items, n=LAST):
    return deque(items, maxlen=n)


def _segment_end(text, i):
    m = _SENTENCE_END.search(text, i, min(len(text), i + SENTENCE_LIMIT))
    return m.start() if m else min(len(text), i + SENTENCE_LIMIT)


def _commit(values, text, start, end, weak=False):
    """What the piece text[start:end] commits to: ("read", value), ("ambiguous", None), ("refuted",
    [values]) when it only rules values out, or None when it names no value. A weak marker's piece
    must name exactly one value."""
    piece = values.focus(text[start:end], bool(weak))
    found = values.find(piece) if values.discrete else []
    # "..., which is why": what follows explains; not inside a value ("reverberate when touched together")
    cuts = [m.start() for m in _CLAUSE_CUT.finditer(piece) if m.start() > 0 and not any(f.start <= m.start() < f.end for f in found)]
    cut = cuts[0] if cuts else len(piece)
    if values.discrete:
        found = [f for f in found if f.start < cut]
    else:
        piece = piece[:cut]
        found = values.find(piece)
    if not found or (weak and len(found) != 1):
        return None
    kept, refuted = [], []
    for k, f in enumerate(found):
        before = piece[found[k - 1].end if k else 0:f.start]
        after = piece[f.end:found[k + 1].start if k + 1 < len(found) else len(piece)]
        if _NEGATED_BEFORE.search(before) or _REFUTED_AFTER.match(after):
            refuted.append(f.value)
        else:
            kept.append((k, f))
    if not kept:
        return None if weak else ("refuted", refuted)  # "so (C) is wrong" rules out; it commits to nothing
    k0, first = kept[0]
    if values.binary and any(values.same(first.value, r) for r in refuted):
        return ("ambiguous", piece[first.start:first.end])
    for (_, a), (k, f) in zip(kept, kept[1:]):  # two different values joined by "or": no decision
        if values.same(a.value, f.value):
            continue
        if _OR_BETWEEN.match(piece[found[k - 1].end:f.start]) or _EITHER_BEFORE.search(piece[:a.start]):
            return ("ambiguous", piece[a.start:f.end])
    return ("read", first.value)


def _commitments(text, values):
    """[(position, outcome)] of every statement in `text` that commits to (or refutes) a value."""
    out = []
    lines = [m.start() for m in re.finditer(r"(?m)^.*\S", text)]
    closing = lines[-1] if lines else 0  # "so", "therefore" conclude only on the last line, not in the working
    for pattern, weak in values.markers:
        for m in _last(re.finditer(pattern, text, flags=re.I)):
            if weak == CONCLUDING and m.end() < closing or _CHECKING.search(text, max(0, m.start() - 30), m.start()):
                continue
            end = _segment_end(text, m.end())
            got = _commit(values, text, m.end(), end, weak)
            if got is not None:  # an undecided one at its sentence's end: "is **X** or Y" is undecided, X bold or not
                out.append((end if got[0] == "ambiguous" else m.start(), got, bool(weak)))
    for start, inner in _last(sorted(values.emphasised(text))):  # \boxed{...}, **...**, \textbf{...}
        got = _commit(values, inner, 0, len(inner))
        if got is not None and got[0] == "ambiguous" and values.boxed_list(inner) is not None:
            got = ("read", values.boxed_list(inner))
        if got is not None:
            out.append((start, got, False))
    for start, piece in _last(sorted(values.statements(text))):
        got = _commit(values, piece, 0, len(piece))
        if got is not None:
            out.append((start, got, False))
    # "It's either X or Y", "torn between X and Y", "X or Y, I cannot decide": undecided at the end.
    for m in _last(_UNDECIDED.finditer(text), 16):
        start = max([text.rfind(ch, max(0, m.start() - SENTENCE_LIMIT), m.start()) for ch in ".!?\n"] + [m.start() - SENTENCE_LIMIT]) + 1
        end = _segment_end(text, m.end())
        got = _commit(values, text, start, end)
        if got is not None and got[0] == "ambiguous":
            out.append((end, got, False))  # the sentence's last word: nothing inside it overrides it
    if not values.discrete:
        return out + _closing_line(text, values)
    # "(B) is correct", "Option C is the right answer": said right, without a marker before it.
    for f in _last(values.find(text), 4 * LAST):
        if _AFFIRMED_AFTER.match(text[f.end:f.end + 60]) and not _NEGATED_BEFORE.search(text[max(0, f.start - 30):f.start]):
            out.append((f.start, ("read", f.value), False))
    if values.binary:  # "No would be wrong here." commits to yes
        out += [(pos, ("read", values.complement(v)), False) for pos, v in _refutations(text, values)]
    return out + _closing_line(text, values)


_UNDECIDED = re.compile(r"\b(?:either|torn\s+between|can(?:no|')?t\s+(?:decide|choose|tell|rule\s+out)|"
                        r"could\s+(?:just\s+)?as\s+well\s+be|not\s+sure\s+(?:whether|if|between)|undecided)\b", re.I)


def _closing_line(text, values):
    """The last line, when it is only a value ("C", "(B).", "**42**", "$\\frac{1}{2}$", "B, not C")."""
    lines = [(m.start(), m.group()) for m in re.finditer(r"[^\n]+", text) if m.group().strip()]
    if not lines or not values.bare_line:
        return []
    start, line = lines[-1]
    core = re.sub(r"^(?:[\s#>*_•]|-(?![\d.]))*(?:(?:the\s+)?(?:correct\s+|right\s+)?(?:option|choice)\b[\s:.\-]*)?"
                  r"|[\s*_.!]*$", "", line, flags=re.I)  # "Option B" as AQuA's rationales end
    if not any(f.start == 0 for f in values.find(core)):
        core = re.sub(r"^(?:a|an|the)\s+", "", core)  # "a tie"
    if len(core) > 60 or not values.bare(core):
        return []
    found = values.find(core)
    if values.discrete:  # "C", "(B) 25 km": little beside the value; "Both are fine." is no verdict
        rest = "".join(ch for i, ch in enumerate(core) if not any(f.start <= i < f.end for f in found))
        if len(re.findall(r"[A-Za-z]{2,}", rest)) > 1:
            return []
    got = _commit(values, core, 0, len(core)) if found and found[0].start == 0 else None
    return [(start, got, True)] if got and got[0] == "read" else []  # "B, not C." is B


def _refutations(text, values):
    """[(position, value)] for values ruled out anywhere ("(C) cannot be right", "1250 is wrong")."""
    out = []
    if not values.discrete:
        return out
    for f in _last(values.find(text), 4 * LAST):
        if _REFUTED_AFTER.match(text[f.end:f.end + 60]):
            out.append((f.start, f.value))
    return out


def read_conclusion(text, values):
    """The Reading of `text` for one kind of values (see kinds.py)."""
    text = clean(text)
    if not text.strip():
        return NOTHING
    made = _commitments(text, values)
    opening = values.opening(text)
    if opening is not None:
        made.append((-1, ("read", opening), False))
    # Hedged and concluding words ("probably", "so"), and a closing line, count only where the reply
    # commits nowhere in plain terms: "\\boxed{30} ... so QM/PQ = 15/17" is 30.
    if any(not weak and outcome[0] != "refuted" for _, outcome, weak in made):
        made = [c for c in made if not c[2]]
    made = sorted(made, key=lambda c: c[0])
    if not made:
        return NOTHING
    at, (status, value), _ = made[-1]
    if status == "ambiguous":
        return Reading(None, AMBIGUOUS, value)
    if status == "refuted":
        if values.binary and len({values.complement(v) for v in value}) == 1:
            return Reading(values.complement(value[0]), READ)
        return NOTHING
    if any(pos > at and values.same(v, value) for pos, v in _refutations(text, values)):
        return NOTHING
    return Reading(value, READ)


def found_in(pattern, text, convert, flags=0):
    """Found for every match of `pattern` whose `convert(match)` is not None."""
    out = []
    for m in re.finditer(pattern, text, flags):
        v = convert(m)
        if v is not None:
            out.append(Found(m.start(), m.end(), v))
    return out


def no_overlaps(found):
    """Longest first where spans overlap, then in text order."""
    kept = []
    for f in sorted(found, key=lambda f: (f.start, -(f.end - f.start))):
        if not kept or f.start >= kept[-1].end:
            kept.append(f)
    return kept
