"""Tool calls in a model's output, read in its family's format: Hermes (`<tool_call>{json}</tool_call>`,
Qwen 2.5/3), Llama 3.x JSON (`{"name", "parameters"}`, optionally after `<|python_tag|>`) and Mistral
(`[TOOL_CALLS][{json}, ...]`, or the newer `[TOOL_CALLS]name[ARGS]{json}`).

A parser splits a text into items, in order: strings (content) and calls ({"name", "arguments": JSON
text}). The model's text is untrusted: a parser never raises, and a call that does not parse (bad
JSON, no name, arguments that are not an object) stays in the content as the text it was.

Streaming reads the same way: `parse(text, final=False)` commits only what more text cannot change
(a call once it is complete, content that cannot be the start of a call), so the items committed for a
prefix begin the items of the whole text, and ToolStream's deltas reassemble to what `parse_output`
gives for the whole text."""
from __future__ import annotations

import json
import re
import secrets
import string

DECODER = json.JSONDecoder()


def partial_suffix(text, marker):
    """How many characters at the end of `text` could be the start of `marker` (being written)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def as_call(obj):
    """{"name", "arguments"} of a decoded call object, or None when it is not one. Llama writes the
    arguments as "parameters"; some models write them as JSON text."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = loads(args)
    if not isinstance(args, dict):
        return None
    return {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}


def loads(text):
    """JSON text to a value, or None when it is not JSON (or nests too deep to read)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def decode_at(text, pos):
    """(the JSON value at text[pos:], where it ends), or None when none is complete there."""
    try:
        return DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError):
        return None


class Hermes:
    """<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, as many as the model writes."""
    name, start, end = "hermes", "<tool_call>", "</tool_call>"
    markers = (start, end)

    def parse(self, text, final):
        """(items, characters committed)."""
        items, pos = [], 0
        while True:
            i = text.find(self.start, pos)
            if i < 0:
                cut = len(text) - (0 if final else partial_suffix(text[pos:], self.start))
                items.append(text[pos:cut])
                return items, cut
            items.append(text[pos:i])
            j = text.find(self.end, i)
            if j < 0 and not final:  # a call being written
                return items, i
            after = len(text) if j < 0 else j + len(self.end)  # unclosed at the end: read what is there
            call = as_call(loads(text[i + len(self.start):j if j >= 0 else len(text)]))
            items.append(call or text[i:after])
            pos = after


class Llama3Json:
    """The whole answer is the call: {"name": ..., "parameters": {...}} (several: separated by ";"),
    optionally after <|python_tag|>. Text that does not begin so is content."""
    name, tag = "llama3_json", "<|python_tag|>"
    markers = (tag,)

    def parse(self, text, final):
        body = text.lstrip()
        pos = len(text) - len(body)
        if body.startswith(self.tag):
            pos += len(self.tag)
        elif not final and self.tag.startswith(body):  # nothing yet, or the tag being written
            return [], 0
        items = []  # the tag and the separators between calls are markup, not content
        while True:
            rest = text[pos:]
            stripped = rest.lstrip().removeprefix(";").lstrip()
            if not stripped.startswith("{"):
                if not final and not stripped:  # perhaps a separator before the next call
                    return items, pos
                return items + [rest], len(text)
            start = len(text) - len(stripped)
            found = decode_at(text, start)
            if found is None:  # incomplete (wait), or not JSON (at the end: content)
                return (items, pos) if not final else (items + [rest], len(text))
            call = as_call(found[0])
            if call is None:  # JSON, but not a call: the rest is content
                return items + [rest], len(text)
            items.append(call)
            pos = found[1]


class Mistral:
    """[TOOL_CALLS] then a JSON list of {"name", "arguments"} (or one object), or name[ARGS]{...}."""
    name, start, args = "mistral", "[TOOL_CALLS]", "[ARGS]"
    markers = (start, args)
    NAME = re.compile(r"\s*([A-Za-z0-9_.\-]{1,64})\[ARGS\]")

    def parse(self, text, final):
        items, pos = [], 0
        while True:
            i = text.find(self.start, pos)
            if i < 0:
                cut = len(text) - (0 if final else partial_suffix(text[pos:], self.start))
                items.append(text[pos:cut])
                return items, cut
            items.append(text[pos:i])
            calls, after = self.block(text, i + len(self.start))
            if calls is None and not final:  # incomplete: wait for more (or the end)
                return items, i
            if calls is None:  # never completed: what is there is content
                items.append(text[i:])
                return items, len(text)
            items += calls if all(calls) else [text[i:after]]
            pos = after

    def block(self, text, pos):
        """(the calls after a [TOOL_CALLS] at pos (a None for each that is not one), where they end), or
        (None, pos) when no complete block is there."""
        stripped = text[pos:].lstrip()
        start = len(text) - len(stripped)
        if stripped[:1] in ("[", "{"):
            found = decode_at(text, start)
            if found is None:
                return None, pos
            value, end = found
            return [as_call(v) for v in (value if isinstance(value, list) else [value])] or [None], end
        named = self.NAME.match(text, pos)
        found = named and decode_at(text, named.end())
        if not found:
            return None, pos
        return [as_call({"name": named.group(1), "arguments": found[0]})], found[1]


PARSERS = {p.name: p for p in (Hermes(), Llama3Json(), Mistral())}


def call_id(parser):
    """A new tool call's id. Mistral's templates require ids of 9 letters and digits."""
    if parser.name == "mistral":
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"


def tool_call(parser, call):
    return {"id": call_id(parser), "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]}}


def split(parser, text, single=False, forced=False):
    """(content, calls) of a whole text: content is the text outside calls; with calls, whitespace only
    is None. single: the first call only (parallel_tool_calls false). forced: the grammar allowed calls
    only, so any text outside them is a call cut by max_tokens, never content (None)."""
    items, _ = parser.parse(text, final=True)
    calls = [item for item in items if isinstance(item, dict)][:1 if single else None]
    content = "".join(item for item in items if isinstance(item, str))
    return (content if (content.strip() or not calls) and not forced else None), calls


def parse_output(parser, text, single=False, forced=False):
    """(content, OpenAI tool_calls) of a whole output."""
    content, calls = split(parser, text, single, forced)
    return content, [tool_call(parser, c) for c in calls]


class ToolStream:
    """One streamed choice's text as chat deltas: content while no call is being written (trailing
    whitespace held, dropped at the end when it is all the content of an answer with calls), and each
    call as two deltas once complete: index, id, type and name first, then its arguments."""

    def __init__(self, parser, single=False, forced=False):
        self.parser, self.single, self.forced = parser, single, forced  # forced: no content (split)
        self.text, self.sent, self.calls = "", 0, 0

    def feed(self, delta, final=False):
        """The deltas ({"content"} or {"tool_calls"} dicts) the text up to now adds."""
        self.text += delta
        items, _ = self.parser.parse(self.text, final)
        calls = [item for item in items if isinstance(item, dict)][:1 if self.single else None]
        content = "" if self.forced else "".join(item for item in items if isinstance(item, str))
        if not final:
            content = content.rstrip()
        elif not content.strip() and calls:
            content = ""
        deltas = [{"content": content[self.sent:]}] if len(content) > self.sent else []
        self.sent = max(self.sent, len(content))
        for k, call in enumerate(calls[self.calls:], self.calls):
            head = tool_call(self.parser, call)
            head["function"]["arguments"] = ""
            deltas += [{"tool_calls": [{"index": k, **head}]},
                       {"tool_calls": [{"index": k, "function": {"arguments": call["arguments"]}}]}]
        self.calls = len(calls)
        return deltas
