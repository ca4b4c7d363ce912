"""Tools offered to a chat request: whether the model can take them, how they reach its chat template,
which parser reads its calls, and the grammar that forces a call.

- The tools go to the chat template as transformers gives them (`apply_chat_template(messages,
  tools=...)`); a template that never mentions `tools` has no tool format, and offering it tools is a
  400 (unless tool_choice is "none": then they are simply left out). The embedded SmolLM2's template has
  none, so its chats that offer tools (or carry calls and tool answers) are rendered with the generic
  ChatML template shipped here (templates/tools_chatml.jinja, Hermes-style calls); `serve --chat-template`
  replaces a model's template altogether, as vLLM's flag does.
- The parser is the template's family (its call markers say which: `<tool_call>` Hermes, `[TOOL_CALLS]`
  Mistral, `<|python_tag|>` or `ipython` Llama 3 JSON), or the server's `--tool-call-parser`.
- tool_choice "auto": free generation, then parsed. "none": the tools are in the prompt (as vLLM does)
  but the output is not parsed. "required" or a named function: the output is constrained (llguidance,
  engine/grammar.py) to calls in the family's format, each a JSON object whose name is one of the tools
  (the named one) and whose arguments follow that tool's parameter schema; one call when named or
  parallel_tool_calls is false.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.sampling.strict_schema import strict
from ..engine.grammar import JSON_OPTIONS  # JSON without free whitespace, as every schema is compiled
from ..engine.tool_call_closing import closing_comment
from .schemas import APIError, structured
from .tool_parsers import PARSERS

CHOICES = ("none", "auto", "required")
TOOLS_TEMPLATE = Path(__file__).with_name("templates") / "tools_chatml.jinja"


@dataclass
class ToolPlan:
    tools: list[dict]  # to the chat template
    parser: object | None  # reads calls from the output; None: tool_choice "none", not parsed
    grammar: str | None = None  # a Lark grammar that forces a call (tool_choice required, or named)
    single: bool = False  # at most one call
    keep: dict[int, str] = field(default_factory=dict)  # special tokens of the call markers: id -> text


def template_source(tokenizer, template_kwargs=None):
    """The chat template transformers would render with tools (a named "tool_use" one, if there is)."""
    source = (template_kwargs or {}).get("chat_template") or getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):
        source = source.get("tool_use") or source.get("default")
    return source if isinstance(source, str) else None


def default_tools_template(llm):
    """The shipped tools template when `llm` is the embedded model (whose own template has no tool format),
    else None: other models keep their own templates, with or without tools."""
    from ..engine.loader import DEFAULT_MODEL, resolve_model
    model_dir = getattr(llm, "model_dir", None)
    if model_dir is None:
        return None
    try:
        embedded = resolve_model(DEFAULT_MODEL)
    except Exception:  # noqa: BLE001 - the embedded model not installed: nothing to compare with
        return None
    return TOOLS_TEMPLATE.read_text() if Path(model_dir).resolve() == Path(embedded).resolve() else None


def tools_template_kwargs(served, template_kwargs, uses_tools):
    """The template kwargs of a chat: with the model's tools template added when the chat uses tools, the
    request names no template, and the model's own renders none."""
    template_kwargs = dict(template_kwargs or {})
    fallback = getattr(served, "tools_template", None)
    if (uses_tools and fallback and "chat_template" not in template_kwargs
            and not supports_tools(template_source(served.llm.tokenizer))):
        template_kwargs["chat_template"] = fallback
    return template_kwargs


def supports_tools(source):
    return source is not None and re.search(r"\btools\b", source) is not None


def family(source):
    """The parser a template's own call markers name, or None when they name none."""
    for marker, name in (("[TOOL_CALLS]", "mistral"), ("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"),
                         ("ipython", "llama3_json")):
        if marker in source:
            return name
    return None


def marker_tokens(tokenizer, parser, special_only=False):
    """The parser's markers that are added tokens of this tokenizer (Qwen's <tool_call>, Mistral's
    [TOOL_CALLS]): id -> text. The grammar must name these by id (llguidance does not match an added token
    by its text); those that are special, decoding skips, so they are kept (special_only)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {i: t.content for i, t in decoder.items()
            if t.content in parser.markers and (t.special or not special_only)}


def plan(body, served, override=None):
    """The ToolPlan of a chat request, or None when it offers no tools; a 400 naming the field at fault."""
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    choice = body.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools: give the tools the model may call", param="tool_choice")
        return None
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise APIError(400, f"tools name a function twice: {', '.join(twice)}", param="tools")
    named = None
    if isinstance(choice, dict):
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError(400, 'tool_choice must be "none", "auto", "required" or {"type": "function", '
                                '"function": {"name": ...}}', param="tool_choice")
        named = function["name"]
        if named not in names:
            raise APIError(400, f"tool_choice names function {named!r}, which is not among the tools "
                                f"({', '.join(names)})", param="tool_choice")
    elif choice is not None and choice not in CHOICES:
        raise APIError(400, f"tool_choice {choice!r} is unknown; one of none, auto, required, or a named "
                            f"function", param="tool_choice")
    choice = "named" if named is not None else choice or "auto"
    tokenizer = served.llm.tokenizer
    source = template_source(tokenizer, tools_template_kwargs(served, body.chat_template_kwargs, True))
    if not supports_tools(source):
        if choice == "none":  # nothing to offer them with, and nothing to read: a plain chat
            return None
        raise APIError(400, f"model `{served.name}`'s chat template has no tool format (it never renders "
                            f"`tools`), so it cannot be offered tools; use a model whose template renders "
                            f"them, or give a chat_template in chat_template_kwargs that does", param="tools")
    if choice == "none":
        return ToolPlan(tools, None)
    name = override or family(source)
    if name is None:
        raise APIError(400, f"model `{served.name}`'s chat template renders tools, but its tool call format "
                            f"is none this server reads; start the server with --tool-call-parser "
                            f"({', '.join(PARSERS)})", param="tools")
    parser = PARSERS[name]
    single = named is not None or body.parallel_tool_calls is False
    tool_plan = ToolPlan(tools, parser, single=single, keep=marker_tokens(tokenizer, parser, special_only=True))
    if choice == "auto":
        return tool_plan
    _, field_ = structured(body)
    if field_ is not None:
        raise APIError(400, f"tool_choice {body.tool_choice!r} constrains the output to tool calls, so "
                            f"{field_} cannot constrain it too", param=field_)
    chosen = [t for t in tools if named is None or t["function"]["name"] == named]
    tool_plan.grammar = call_grammar(parser, chosen, single, marker_tokens(tokenizer, parser))
    check(tool_plan.grammar)
    return tool_plan


# -- the grammar of tool_choice required / named ---------------------------------------------------------
def call_schema(tools, args_key):
    """A JSON schema of one call: {"name": one of the tools, args_key: that tool's parameters}, read as a
    response_format schema is (strict_schema.py: no arguments the tool does not name, unless it says so)."""
    options = [{"type": "object",
                "properties": {"name": {"const": t["function"]["name"]},
                               args_key: strict(t["function"].get("parameters") or {"type": "object"})},
                "required": ["name", args_key], "additionalProperties": False} for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def call_grammar(parser, tools, single, markers):
    """A Lark grammar (llguidance's) of one call, or of several, in the parser's format; markers: those
    that are tokens (marker_tokens), matched as that token."""
    by_text = {text: i for i, text in markers.items()}

    def literal(text):
        return f"<[{by_text[text]}]>" if text in by_text else json.dumps(text)

    def json_rule(schema):
        return "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS})

    more = "" if single else " (sep call)*"
    if parser.name == "hermes":  # the first line: how the engine closes a call within max_tokens
        schema = call_schema(tools, "arguments")
        call = f'{literal(parser.start)} "\\n" {json_rule(schema)} "\\n" {literal(parser.end)}'
        return (closing_comment(parser.start + "\n", "\n" + parser.end, "\n", schema, single, by_text)
                + f'%llguidance {{}}\nstart: call{more}\nsep: "\\n"\ncall: {call}\n')
    if parser.name == "llama3_json":
        schema = call_schema(tools, "parameters")
        return (closing_comment("", "", "; ", schema, single, by_text)
                + f'%llguidance {{}}\nstart: call{more}\nsep: "; "\ncall: {json_rule(schema)}\n')
    schema = {"type": "array", "items": call_schema(tools, "arguments"), "minItems": 1}
    if single:
        schema["maxItems"] = 1
    return (closing_comment(parser.start, "", "", schema, True, by_text)
            + f"%llguidance {{}}\nstart: {literal(parser.start)} {json_rule(schema)}\n")


def check(grammar):
    """A grammar llguidance refuses (a tool's parameters an unsupported or bad schema): a 400 now."""
    from ..engine.grammar import load
    try:
        llguidance = load()
    except ImportError as error:
        raise APIError(400, str(error), param="tool_choice")
    error = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", grammar))
    if error:
        raise APIError(400, f"the tools' parameters cannot be enforced: {error.strip()}", param="tools")


# -- messages to the chat template ------------------------------------------------------------------------
def template_fields(message):
    """A message's tool fields as chat templates read them: an assistant's tool_calls with their arguments
    as objects (templates write them with `tojson`), a tool message's tool_call_id and name."""
    fields = {}
    if message.tool_calls:
        fields["tool_calls"] = []
        for call in message.tool_calls:
            arguments = call.function.arguments
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                pass  # not JSON: the template gets the text as it came
            fields["tool_calls"].append({"id": call.id, "type": "function",
                                         "function": {"name": call.function.name, "arguments": arguments}})
    if message.tool_call_id is not None:
        fields["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        fields["name"] = message.name
    return fields
