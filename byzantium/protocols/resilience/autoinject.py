"""AutoInject: corrupt a fraction of the faulty agent's messages, piece by piece, with an LLM.

For each message of the faulty agent:
    select it with probability Pm;
    split it losslessly into pieces and separators: lines (code tasks) or sentences (other tasks);
    choose each non-blank piece with probability Pe;
    send the chosen pieces to the LLM in ONE request, a JSON object {index: piece}, and ask for a JSON
    object {index: erroneous version} back;
    put each returned version in place of its piece, found by its index key (never by key order).
Nothing chosen: no request. Everything not chosen, and every separator, stays byte for byte. Blank
pieces and, in code, markdown fence lines (```python) are never chosen.

A piece is rewritten inside its own frame: its leading and trailing whitespace (a code line's
indentation) stays, the LLM sees and rewrites the rest. So a rewritten code line keeps its indentation
whatever whitespace the LLM puts around its version, and the further lines of a multi-line version are
indented by the same amount (the LLM wrote them relative to the unindented line). Indentation errors
are therefore never injected; every other error is the LLM's to choose.

The reply is read leniently, because small models rarely write clean JSON (read_versions; how it was
read is recorded as "json"): a JSON object ("ok"); else "index": "text" pairs of a broken or cut-off
object ("partial"); else lines labelled with an asked index, `1: text` ("lines"); else, when one
piece was asked for, the reply's text itself ("text"); code fences around any of these are dropped.
Nothing readable leaves every chosen piece unchanged ("invalid", counted in json_failures). The reply
is another model's output about untrusted text, so it is only ever data: a version replaces only the
asked piece of its index, is refused when it is a refusal, holds control characters, or is much longer
than its piece (MAX_GROWTH), and nothing in it is run or parsed further. A missing index, an empty or
refused value, a version equal to the piece, or one that only completes it (closing marks added, or a
piece cut off with a bracket open continued: `def f(a: int,` -> `def f(a: int, b: int) -> int`; no error
in either) leaves that piece unchanged (counted in
pieces_unchanged), so a run whose every "rewrite" was such a completion reports none. A number as value counts as its text (the reference dropped numeric changes).
Choices come from random.Random seeded by sha256 of (seed, task id, message index).
"""
import json
import random
import re

from ...backends import SamplingParams
from .kinds import kind_of
from .structures import Fault
from .util import parse_json_object, stable_seed

ERROR_TYPES = ("semantic", "syntactic")
UNITS = ("line", "sentence")
PARAMS = SamplingParams(max_tokens=2048, temperature=0.0)
# A version may be this many times its piece's length (plus SLACK characters): an error is a small
# change, and a reply that pastes a whole essay or our instructions in place of a line is no error.
MAX_GROWTH, SLACK = 3, 80

# Separators, captured so that re.split keeps them: [piece, sep, piece, ..., piece] joins back exactly.
# Sentences end at . ! ? (optionally closed by a quote or bracket) before whitespace, at CJK end marks,
# and at line breaks. Commas never split: they stay inside their sentence.
_LINE = re.compile(r"(\r\n|\n|\r)")
_SENTENCE = re.compile(r"(\s*\n\s*|(?<=[.!?])\s+|(?<=[.!?][\"'”’)\]])\s+|(?<=[。！？])\s*)")
_FRAME = re.compile(r"(\s*)(.*?)(\s*)\Z", re.S)
# Reading replies: a fenced block's body; "key": "value" pairs (the value may be cut off at the end);
# a line labelled with an index (`1: x`, `1. x`, `[1] x`, `"1": x`); a refusal; control characters.
_FENCE = re.compile(r"```[^\n`]*\n?(.*?)(?:```|\Z)", re.S)
_PAIR = re.compile(r'"\s*(\d+)\s*"\s*:\s*"((?:[^"\\]|\\.)*)(?:"|\Z)', re.S)
_LABELLED = re.compile(r'^\s*(?:\[(\d+)\]|"?(\d+)"?\s*(?::|[.)](?=\s)))\s*(.*?)\s*,?\s*$')
_KEYED = re.compile(r'^\s*\{|"\s*\d+\s*"\s*:')  # the start of an object, or a "1": key: no plain version
_REFUSAL = re.compile(r"^\W*(i'?m sorry|sorry|i cannot|i can'?t|as an ai)\b", re.I)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CLOSING = re.compile(r"[\s)\]}:;,.'\"]*")  # what finishes a cut-off piece without changing it

INJECT_SYSTEM = (
    "You help test how multi-agent systems cope with a faulty member by planting errors in the messages "
    "it sends. You rewrite pieces of a message as instructed and reply with a JSON object only.")
ERRORS = {
    "semantic": "a semantic error: it stays well-formed and plausible, but its meaning is wrong (for example "
                "a changed number, operator, condition, bound, word sense or negation)",
    "syntactic": "a syntactic error: it becomes malformed while its intent stays recognisable (for example a "
                 "missing bracket, colon or quote, a misspelt keyword or word, broken grammar or word order)",
}


def split(text: str, unit: str) -> list:
    """[piece, separator, piece, ..., piece]: pieces at even positions; "".join() gives `text` back."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    return (_LINE if unit == "line" else _SENTENCE).split(text)


def _carries_content(piece: str, unit: str) -> bool:
    # Blank pieces carry nothing; a code fence line is markup: breaking it would break the extraction
    # of the whole block rather than plant an error in the code.
    core = piece.strip()
    return bool(core) and not (unit == "line" and core.startswith("```"))


def frame(piece: str):
    """(leading whitespace, core, trailing whitespace) of a piece."""
    return _FRAME.match(piece).groups()


def reframe(piece: str, version: str) -> str:
    """`version` in place of the piece's core, inside the piece's whitespace frame."""
    lead, _, trail = frame(piece)
    lines = version.strip().split("\n")
    return lead + "\n".join([lines[0]] + [lead + line if line.strip() else line for line in lines[1:]]) + trail


def read_versions(reply, keys):
    """({index: version text} for the asked `keys`, how it was read: ok | partial | lines | text | invalid)."""
    reply = reply or ""
    fenced = _FENCE.findall(reply)
    body = "\n".join(fenced) if fenced else reply
    obj = parse_json_object(reply)
    if obj is not None:
        obj = {str(k).strip(): v for k, v in obj.items()}
        obj = {k: str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for k, v in obj.items()}
        return {k: obj[k] for k in keys if isinstance(obj.get(k), str)}, "ok"
    pairs = {k: _unescape(v) for k, v in _PAIR.findall(body)}
    if any(k in pairs for k in keys):
        return {k: pairs[k] for k in keys if k in pairs}, "partial"
    labelled = {}
    for line in body.splitlines():
        m = _LABELLED.match(line)
        if m and (m[1] or m[2]) in keys and m[3].strip('"'):
            labelled.setdefault(m[1] or m[2], m[3].strip('"'))
    if labelled:
        return labelled, "lines"
    text = body.strip().strip('"').strip()
    if len(keys) == 1 and text and not _KEYED.search(text):  # a mangled object is no version
        return {keys[0]: text}, "text"
    return {}, "invalid"


def _unescape(value):
    try:
        return json.loads(f'"{value}"')
    except ValueError:  # a cut-off escape: the raw text
        return value


def completes(piece, version) -> bool:
    """Does `version` only finish `piece`: keep it whole as its start and add closing marks only, or
    continue a piece left with a bracket open (a signature cut off at the reply limit: `def f(a: int,` ->
    `def f(a: int, b: int) -> int`)? Nothing of the piece changes: that plants no error."""
    core, start = version.strip(), piece.strip()
    if not core.startswith(start):
        return False
    unclosed = sum(start.count(c) for c in "([{") > sum(start.count(c) for c in ")]}")
    return unclosed or _CLOSING.fullmatch(core[len(start):]) is not None


def acceptable(piece, version) -> bool:
    """Is `version` a usable erroneous version of `piece` (see the module's notes)?"""
    core = version.strip()
    return bool(core) and core != piece and not _REFUSAL.match(core) and not _CONTROL.search(core) and \
        len(core) <= MAX_GROWTH * len(piece) + SLACK and not completes(piece, core)


class AutoInject(Fault):
    name = "autoinject"

    def __init__(self, pm=1.0, pe=0.2, error_type="semantic", seed=0, llm=None, params=None):
        for label, p in (("pm", pm), ("pe", pe)):
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
                raise ValueError(f"{label} must be a probability in [0, 1], got {p!r}")
        if error_type not in ERROR_TYPES:
            raise ValueError(f"error type must be one of {ERROR_TYPES}, got {error_type!r}")
        self.pm, self.pe, self.error_type, self.seed = float(pm), float(pe), error_type, seed
        self.llm, self.params = llm, params or PARAMS
        self.stats = {"messages_seen": 0, "messages_selected": 0, "pieces_chosen": 0, "pieces_rewritten": 0,
                      "pieces_unchanged": 0, "json_failures": 0, "llm_calls": 0}

    def describe(self) -> dict:
        return {"name": self.name, "pm": self.pm, "pe": self.pe, "error_type": self.error_type, "seed": self.seed}

    async def corrupt_message(self, llm, text, task, index):
        kind = kind_of(task)
        rng = random.Random(stable_seed("autoinject", self.seed, task.id, index))
        self.stats["messages_seen"] += 1
        record = {"selected": False, "pieces": 0, "chosen": [], "rewritten": [], "json": None, "reply": None}
        if not rng.random() < self.pm:
            return text, record
        self.stats["messages_selected"] += 1
        parts = split(text, kind.unit)
        slots = [i for i in range(0, len(parts), 2) if _carries_content(parts[i], kind.unit)]
        chosen = [k for k in range(len(slots)) if rng.random() < self.pe]
        record.update(selected=True, pieces=len(slots), chosen=chosen)
        self.stats["pieces_chosen"] += len(chosen)
        if not chosen:
            return text, record

        pieces = {str(k): frame(parts[slots[k]])[1] for k in chosen}
        self.stats["llm_calls"] += 1
        out = await llm.chat(self.request(kind, pieces), self.params, tag="inject")
        record["reply"] = out.text
        versions, record["json"] = read_versions(out.text, list(pieces))
        if record["json"] == "invalid":
            self.stats["json_failures"] += 1
        for k in chosen:
            version = versions.get(str(k))
            if version is not None and acceptable(pieces[str(k)], version):
                parts[slots[k]] = reframe(parts[slots[k]], version)
                record["rewritten"].append(k)
        self.stats["pieces_rewritten"] += len(record["rewritten"])
        self.stats["pieces_unchanged"] += len(chosen) - len(record["rewritten"])
        return "".join(parts), record

    def request(self, kind, pieces) -> list:
        unit = "lines of code" if kind.unit == "line" else "sentences"
        ask = (f"The message comes from an agent in a team that is {kind.job}. The next message holds a JSON "
               f"object mapping indices to {unit} taken from it. Rewrite each one so that it contains "
               f"{ERRORS[self.error_type]}. Make the error subtle and specific to the task; keep each "
               f"rewrite close to the original in length and style. Reply with only a JSON object with the "
               f"same keys, each mapped to its rewritten text.")
        return [{"role": "system", "content": INJECT_SYSTEM},
                {"role": "user", "content": ask},
                {"role": "user", "content": json.dumps(pieces, ensure_ascii=False, indent=1), "untrusted": True}]
