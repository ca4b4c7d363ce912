"""The tool call parsers (byzantium/server/tool_parsers.py): each family's calls are read, malformed ones stay
content, nothing the model writes makes a parser raise, and streaming in any chunking gives what the whole
text gives."""
import json
import random

import pytest

from byzantium.server.tool_parsers import PARSERS, ToolStream, parse_output, split

HERMES, LLAMA, MISTRAL = PARSERS["hermes"], PARSERS["llama3_json"], PARSERS["mistral"]


def call(name, **arguments):
    return {"name": name, "arguments": json.dumps(arguments)}


# -- Hermes (Qwen) -----------------------------------------------------------------------------------------
def test_hermes_calls_and_content():
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')
    assert split(HERMES, text) == ("Let me look.\n\n", [call("get_weather", city="Paris"), call("get_time", tz="CET")])
    only = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n'
    assert split(HERMES, only) == (None, [call("f")])  # whitespace alone around calls is no content
    assert split(HERMES, "plain answer") == ("plain answer", [])
    assert split(HERMES, "  ") == ("  ", [])  # no calls: the text as it is


def test_hermes_malformed_calls_stay_content():
    good = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    for bad in ('<tool_call>{"name": "f", "arguments": {"a": </tool_call>',  # bad JSON
                '<tool_call>{"arguments": {}}</tool_call>',  # no name
                '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>',  # arguments not an object
                '<tool_call>[1, 2]</tool_call>', '<tool_call></tool_call>', '<tool_call>' + "[" * 100_000):
        content, calls = split(HERMES, good + bad)
        assert calls == [call("f", a=1)] and content == bad, bad
    # arguments written as JSON text are read; an unclosed call at the end is read when it parses
    assert split(HERMES, '<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}')[1] == [call("f", a=2)]
    assert split(HERMES, '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>')[1] == []


def test_parallel_tool_calls_false_keeps_the_first():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    assert [c["name"] for c in split(HERMES, text, single=True)[1]] == ["a"]


def test_openai_tool_calls_have_ids_and_json_arguments():
    _, calls = parse_output(HERMES, '<tool_call>{"name": "f", "arguments": {"x": [1, "é"]}}</tool_call>')
    (tool_call,) = calls
    assert tool_call["id"].startswith("call_") and len(tool_call["id"]) > 10 and tool_call["type"] == "function"
    assert tool_call["function"]["name"] == "f" and json.loads(tool_call["function"]["arguments"]) == {"x": [1, "é"]}
    _, (mistral_call,) = parse_output(MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {}}]')
    assert len(mistral_call["id"]) == 9 and mistral_call["id"].isalnum()  # what Mistral's templates require


# -- Llama 3.x JSON ----------------------------------------------------------------------------------------
def test_llama3_json_calls():
    assert split(LLAMA, '{"name": "get_weather", "parameters": {"city": "Oslo"}}') == (None, [call("get_weather", city="Oslo")])
    tagged = '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"n": 1}}'
    assert split(LLAMA, tagged) == (None, [call("a"), call("b", n=1)])
    assert split(LLAMA, '{"name": "a", "arguments": {"k": true}}')[1] == [call("a", k=True)]
    assert split(LLAMA, '  {"name": "a", "parameters": {}} and then text') == (" and then text", [call("a")])


def test_llama3_json_text_that_is_not_a_call_is_content():
    for text in ('The answer is {"name": "a", "parameters": {}}',  # not at the start
                 '{"answer": 42}', '{"name": "a", "parameters": ', "{" * 50_000, "<|python_tag|>print(1)", ""):
        content, calls = split(LLAMA, text)
        assert calls == [] and content.strip() == text.replace("<|python_tag|>", "").strip(), text


# -- Mistral -----------------------------------------------------------------------------------------------
def test_mistral_calls():
    text = 'Sure. [TOOL_CALLS][{"name": "a", "arguments": {"q": "x"}}, {"name": "b", "arguments": {}}]'
    assert split(MISTRAL, text) == ("Sure. ", [call("a", q="x"), call("b")])
    assert split(MISTRAL, '[TOOL_CALLS]{"name": "a", "arguments": {}}') == (None, [call("a")])
    newer = '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]get_time[ARGS]{}'
    assert split(MISTRAL, newer) == (None, [call("get_weather", city="Rome"), call("get_time")])


def test_mistral_malformed_calls_stay_content():
    for bad in ('[TOOL_CALLS][{"name": "a", "arguments": {}}, {"oops": 1}]', '[TOOL_CALLS][{"name": "a"',
                "[TOOL_CALLS] hello", "[TOOL_CALLS]", "[TOOL_CALLS][]", "[TOOL_CALLS]f[ARGS][1]", "[TOOL_CALLS]" + "[" * 50_000):
        content, calls = split(MISTRAL, "x " + bad)
        assert calls == [] and content == "x " + bad, bad


# -- streaming ---------------------------------------------------------------------------------------------
TEXTS = {
    "hermes": ['Checking.\n<tool_call>\n{"name": "w", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "t", "arguments": {}}\n</tool_call>',
               'a <tool_call>{bad}</tool_call> b <tool_call>{"name": "w", "arguments": {"c": "<tool_call>"}}</tool_call>',
               "no calls at all, but a < and <tool", "<tool_call>{\"name\": \"w\", \"arguments\": {}}", "  \n "],
    "llama3_json": ['<|python_tag|>{"name": "w", "parameters": {"city": "x"}}; {"name": "t", "parameters": {}}',
                    '{"answer": 1} plain', "plain text", ' {"name": "w", "parameters": {}} tail', "<|python", "{"],
    "mistral": ['Sure [TOOL_CALLS][{"name": "w", "arguments": {"a": [1, 2]}}]', "[TOOL_CALLS]w[ARGS]{\"a\": 1} after",
                "text [TOOL_CALLS] broken", "[TOOL_", "a [TOOL_CALLS][{\"name\": \"w\"}]"],
}


def reassemble(deltas):
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content", "")
        for entry in delta.get("tool_calls", []):
            if "id" in entry:
                assert entry["index"] not in calls and entry["type"] == "function"
                calls[entry["index"]] = {"name": entry["function"]["name"], "arguments": entry["function"]["arguments"]}
            else:
                calls[entry["index"]]["arguments"] += entry["function"]["arguments"]
    return content, [calls[k] for k in sorted(calls)]


@pytest.mark.parametrize("family", sorted(TEXTS))
def test_streamed_deltas_reassemble_to_the_whole_texts_reading(family):
    parser, rng = PARSERS[family], random.Random(0)
    for text in TEXTS[family]:
        want_content, want_calls = split(parser, text)
        for _ in range(30):
            stream, deltas, pos = ToolStream(parser), [], 0
            while pos < len(text):
                step = rng.randint(1, 6)
                deltas += stream.feed(text[pos:pos + step])
                pos += step
            deltas += stream.feed("", final=True)
            content, calls = reassemble(deltas)
            assert (content or None, calls) == (want_content or None, want_calls), (text, deltas)


def test_streaming_holds_what_may_be_a_call_marker():
    stream = ToolStream(HERMES)
    assert stream.feed("Hi <tool") == [{"content": "Hi"}]  # the space waits too: it may end the content
    assert stream.feed("_call>{\"name\": ") == []
    deltas = stream.feed("\"f\", \"arguments\": {}}</tool_call>")
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert deltas[1] == {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}
    assert stream.feed("", final=True) == [{"content": " "}]  # content "Hi ": its space, at the end
