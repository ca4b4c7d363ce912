"""Forced tool calls end within max_tokens: the closing of a call being written, as JSON schemas have
(json_schema/), for the grammars that force calls (server/tools.py: tool_choice "required" or
a named function).

Such a grammar writes calls as `start` + a JSON object under the call schema + `end`, with `sep` between
calls (Hermes: `<tool_call>\\n` ... `\\n</tool_call>`, "\\n" between; Llama 3 JSON: bare objects, "; "
between; Mistral: `[TOOL_CALLS]` and one JSON array of calls). It says so in a first-line comment that
`closing_comment` writes and `ToolCallCloser.of` reads, so the closing travels with the grammar's text
(SamplingParams.grammar) and needs no field of its own. When the tokens left are about to be just enough,
the request writes the rest of the marker it is in, the closing of its call's JSON and the end marker;
between calls, it ends (EOS) once another whole call could no longer fit. The grammar checks every closing
before it is forced (GrammarState.forced_token), so a closing this reads wrong is never written: the
request then runs as before. A marker that is one added token (Qwen's `<tool_call>`) is named in the
format's "tokens" (text -> id): the grammar takes it only as that token, so the closing writes it as that
token, and reads it back as its text (the tokenizer would split its text, and decoding may skip it)."""
import json

from .json_closing import JsonPrefix
from .json_schema import closing as schema_closing
from .json_schema import members

COMMENT = "// byzantium tool calls: "  # a Lark comment: llguidance skips it
DECODER = json.JSONDecoder()


def closing_comment(start, end, sep, schema, single, tokens=None):
    """The first line of a call grammar, read by ToolCallCloser.of; tokens: {marker text: token id} of the
    markers that are one token each."""
    fmt = {"start": start, "end": end, "sep": sep, "schema": schema, "single": single, "tokens": tokens or {}}
    return COMMENT + json.dumps(fmt) + "\n"


def call_format(grammar):
    """The call format a grammar's first line states, or None when it states none."""
    first = grammar.split("\n", 1)[0]
    if not first.startswith(COMMENT):
        return None
    try:
        fmt = json.loads(first[len(COMMENT):])
    except ValueError:
        return None
    keys = {"start": str, "end": str, "sep": str, "schema": dict, "single": bool}
    if not isinstance(fmt, dict) or any(not isinstance(fmt.get(k), t) for k, t in keys.items()):
        return None
    tokens = fmt.setdefault("tokens", {})
    if not isinstance(tokens, dict) or any(not isinstance(k, str) or not k or type(v) is not int
                                           for k, v in tokens.items()):
        return None
    return fmt


def variants(schema):
    """The call schema as one schema per tool: the schema closing picks an anyOf's branch by the keys
    written, not by the values, and calls to two tools differ first by the value of "name"."""
    if isinstance(schema.get("anyOf"), list):
        return schema["anyOf"]
    items = schema.get("items")
    if schema.get("type") == "array" and isinstance(items, dict) and isinstance(items.get("anyOf"), list):
        return [{**schema, "items": option} for option in items["anyOf"]]
    return [schema]


def json_closing(prefix_text, schema):
    """The shortest closing of a call's JSON written so far, over the tools it may be a call to."""
    found = []
    for option in variants(schema):
        prefix = JsonPrefix()
        prefix.feed(prefix_text)
        text = schema_closing(prefix, option)
        if text is not None:
            found.append(text)
    return min(found, key=len, default=None)


def call_closing(fmt, text):
    """The text that ends `text` (an output under the format) as complete calls: "" where it may end as it
    is, "next" where it may end but would rather a call could follow, None where it cannot be read."""
    start, end, sep, schema = fmt["start"], fmt["end"], fmt["sep"], fmt["schema"]
    least = json_closing("", schema)
    if least is None:
        return None
    pos, lead = 0, start
    while True:
        rest = text[pos:]
        if pos and not rest:
            return ""  # after a complete call
        if len(rest) < len(lead) and lead.startswith(rest):
            return lead[len(rest):] + least + end
        if not rest.startswith(lead):
            return None
        pos += len(lead)
        try:
            _, json_end = DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):  # the call's JSON being written
            rest_of_json = json_closing(text[pos:], schema)
            return None if rest_of_json is None else rest_of_json + end
        after = text[json_end:]
        if len(after) < len(end) and end.startswith(after):
            return end[len(after):]
        if not after.startswith(end):
            return None
        pos, lead = json_end + len(end), sep + start
        if fmt["single"] and text[pos:]:
            return None


class ToolCallCloser:
    """JsonCloser's interface (grammar.py) for call grammars: the tokens of the closing when it must start
    now, else None; between calls, the EOS token once another call would not fit."""

    RESERVE = 6

    def __init__(self, tokenizer, fmt, eos_token_id):
        self.tokenizer, self.fmt, self.eos = tokenizer, fmt, eos_token_id
        self.markers = fmt["tokens"]  # text -> id of the markers that are one token
        self.marker_text = {i: text for text, i in self.markers.items()}
        self.text, self.read, self.wait = "", 0, 0
        least = json_closing("", fmt["schema"]) or ""
        # one sampled token may add a marker piece or a schema member; a new call costs a whole one
        self.reserve = self.RESERVE + max([len(tokenizer.tokenize_str(t)) for t in members(fmt["schema"])], default=0)
        self.next_call = len(self.tokenize(fmt["sep"] + fmt["start"] + least + fmt["end"]))

    def tokenize(self, text):
        """Token ids of `text`, each marker that is a token as that token."""
        ids, pos = [], 0
        while pos < len(text):
            found = [(text.find(m, pos), m) for m in self.markers if text.find(m, pos) >= 0]
            at, marker = min(found, default=(len(text), None))
            if at > pos:
                ids += self.tokenizer.tokenize_str(text[pos:at])
            if marker is None:
                break
            ids.append(self.markers[marker])
            pos = at + len(marker)
        return ids

    def decode(self, ids):
        """The text of `ids`, each marker token as its text."""
        parts, run = [], []
        for token in list(ids) + [None]:
            if token is None or token in self.marker_text:
                if run:
                    parts.append(self.tokenizer.decode_bytes(run).decode("utf-8", "replace"))
                    run = []
                if token is not None:
                    parts.append(self.marker_text[token])
            else:
                run.append(token)
        return "".join(parts)

    @classmethod
    def of(cls, tokenizer, grammar, eos_token_ids):
        fmt = call_format(grammar)
        if fmt is None or not eos_token_ids:
            return None
        return cls(tokenizer, fmt, eos_token_ids[0])

    def closing_tokens(self, output_ids, tokens_left):
        if len(output_ids) > self.read:
            self.text += self.decode(output_ids[self.read:])
            self.read = len(output_ids)
        if self.wait > 0:
            self.wait -= 1
            return None
        text = call_closing(self.fmt, self.text)
        if text is None:
            return None
        if text == "":  # between calls: end while another whole call could no longer fit
            return [self.eos] if tokens_left <= self.next_call + self.reserve else None
        if tokens_left > max(len(text), self.next_call) + self.reserve:  # a token is at least one character;
            # the wait also covers a call ending meanwhile, when the end may have to be forced
            self.wait = (tokens_left - max(len(text), self.next_call) - self.reserve) // (self.reserve + 1)
            return None
        ids = self.tokenize(text)
        if len(ids) > tokens_left:
            self.wait = tokens_left
            return None
        return ids if tokens_left <= len(ids) + self.reserve else None
