"""Tool calls through the server, with the official `openai` client, on real engines.

The model whose template supports tools is a tiny random Llama with the embedded SmolLM2's tokenizer and
a Hermes-style tool template written here (TEMPLATE): random weights, so tool_choice "required" and
named calls come only from the grammar that enforces them, and the round trip shows the whole path:
tools rendered, a call forced, parsed, returned, sent back with the tool's answer, rendered again. The
embedded SmolLM2 (its own template has no tool format) takes tools through the shipped template, and a
template without tools given in the request gives the 400. Forced calls end within max_tokens. Outputs
are never compared to fixed
text: calls are checked against the tools' schemas, and streamed calls against the same request not
streamed (same seed)."""
import json
import shutil

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("llguidance")

from conftest import build_tiny  # noqa: E402
from test_server import MODEL, serve  # noqa: E402
from test_server import llm  # noqa: E402,F401  (the module's served model: the embedded SmolLM2)

TOOLS_MODEL = "tiny-tools"

# A ChatML template that lists the tools in the system turn, writes an assistant's calls as
# <tool_call>{"name", "arguments"}</tool_call> and a tool's answer as <tool_response> in a user turn.
TEMPLATE = r"""
{%- set first = messages[0] if messages else none %}
{%- set system = first.content if first and first.role == 'system' else 'You are a helpful assistant.' %}
{{- '<|im_start|>system\n' + system }}
{%- if tools %}
{{- '\n\nYou can call these functions (one JSON signature a line):\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\nTo call one, write <tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- for message in messages %}
{%- if message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' + (message.content or '') }}
{%- for call in message.tool_calls or [] %}
{{- '\n<tool_call>\n{"name": ' + (call.function.name | tojson) + ', "arguments": ' + (call.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- elif not (loop.first and message.role == 'system') %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_llm(smollm2_dir, tmp_path_factory):
    """A tiny random Llama with SmolLM2's vocabulary and tokenizer, and TEMPLATE as its chat template."""
    from byzantium.backends import LLMPool
    path = tmp_path_factory.mktemp("tiny-tools")
    build_tiny("llama", vocab_size=49152, bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_dir / name, path / name)
    (path / "chat_template.jinja").write_text(TEMPLATE)
    pool = LLMPool("native", device="cpu", num_blocks=256, max_model_len=1024)
    yield pool.get(str(path))
    pool.close()


def client_of(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="anything", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def client(llm, tools_llm):  # noqa: F811
    from byzantium.server.app import build_app
    with serve(build_app({MODEL: llm, TOOLS_MODEL: tools_llm})) as url:
        yield client_of(url)


def valid_call(call):
    """A call's arguments parse and follow its tool's schema."""
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(arguments) == {"city", "unit"} and isinstance(arguments["city"], str)
        assert len(arguments["city"]) <= 12 and arguments["unit"] in ("celsius", "fahrenheit")
    else:
        assert call.function.name == "get_time" and arguments == {"zone": arguments["zone"]}
        assert arguments["zone"] in ("UTC", "CET", "PST")
    assert call.type == "function" and (call.id.startswith("call_") or len(call.id) == 9 and call.id.isalnum())
    return arguments


def ask(client, messages=ASK, **kw):
    kw = {"temperature": 1.0, "seed": 7, "max_tokens": 120, "tools": TOOLS, **kw}
    return client.chat.completions.create(model=TOOLS_MODEL, messages=messages, **kw)


# -- the round trip ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_call_round_trip(client, choice):
    reply = ask(client, tool_choice=choice, parallel_tool_calls=False, extra_body={"return_token_ids": True})
    (choice0,) = reply.choices
    assert choice0.finish_reason == "tool_calls", choice0
    (call,) = choice0.message.tool_calls
    arguments = valid_call(call)
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    assert choice0.message.content is None
    # the client runs the tool and answers with a role "tool" message; the model replies
    answer = json.dumps({"result": "sunny", "asked": arguments})
    history = ASK + [choice0.message,  # sent back as the client gives it (its null fields too)
                     {"role": "tool", "tool_call_id": call.id, "content": answer}]
    for follow in ("auto", "none"):
        second = ask(client, history, tool_choice=follow, max_tokens=24, extra_body={"return_token_ids": True})
        (reply2,) = second.choices
        assert reply2.finish_reason in ("stop", "length") and not reply2.message.tool_calls
        assert isinstance(reply2.message.content, str)
        # the call and the tool's answer reached the model: they are in the prompt the template rendered
        prompt = tokenizer_of(client).decode(second.prompt_token_ids)
        assert f'"name": "{call.function.name}", "arguments": {json.dumps(arguments)}' in prompt
        assert f"<tool_response>\n{answer}\n</tool_response>" in prompt and "<tools>" in prompt


def tokenizer_of(client):
    from transformers import AutoTokenizer
    from byzantium.engine.loader import resolve_model
    return AutoTokenizer.from_pretrained(resolve_model(MODEL))  # the tiny model's tokenizer is SmolLM2's


def test_named_choice_calls_that_function(client):
    for seed in range(3):
        reply = ask(client, tool_choice={"type": "function", "function": {"name": "get_time"}}, seed=seed)
        (call,) = reply.choices[0].message.tool_calls
        assert call.function.name == "get_time" and valid_call(call)
        assert reply.choices[0].finish_reason == "tool_calls"


def test_required_with_parallel_calls_gives_valid_calls(client):
    reply = ask(client, tool_choice="required", seed=3, max_tokens=200, n=2)
    for choice in reply.choices:  # more calls may follow until max_tokens: every complete one is valid
        assert choice.message.tool_calls and choice.finish_reason in ("tool_calls", "length")
        for call in choice.message.tool_calls:
            valid_call(call)
        ids = [call.id for call in choice.message.tool_calls]
        assert len(set(ids)) == len(ids)


# -- streaming -----------------------------------------------------------------------------------------------
def streamed(client, **kw):
    chunks = list(ask(client, stream=True, **kw))
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for entry in delta.tool_calls or []:
                if entry.id is not None:  # a call's first delta: id, type, name
                    assert entry.index not in calls and entry.type == "function" and entry.function.name
                    calls[entry.index] = {"id": entry.id, "name": entry.function.name,
                                          "arguments": entry.function.arguments or ""}
                else:
                    assert entry.function.name is None
                    calls[entry.index]["arguments"] += entry.function.arguments or ""
            finish = choice.finish_reason or finish
    assert chunks[-1].choices[-1].finish_reason == finish  # the finish comes last
    return content, [calls[k] for k in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_streamed_tool_calls_match_the_same_request_not_streamed(client, choice):
    kw = dict(tool_choice=choice, seed=11, max_tokens=200)
    content, calls, finish = streamed(client, **kw)
    whole = ask(client, **kw).choices[0]
    assert finish == whole.finish_reason and calls
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert (content or None) == whole.message.content
    for c in calls:
        assert c["id"].startswith("call_") and json.loads(c["arguments"])


def test_streamed_plain_answer_with_tools_offered(client):
    """tool_choice auto on random weights: plain text, streamed as content, as the request not streamed."""
    kw = dict(tool_choice="auto", seed=5, max_tokens=24)
    content, calls, finish = streamed(client, **kw)
    whole = ask(client, **kw).choices[0]
    assert calls == [] and not whole.message.tool_calls
    assert content == whole.message.content and finish == whole.finish_reason


def test_auto_reads_what_the_model_wrote(client):
    """tool_choice auto parses whatever the model writes: here a guided_choice makes the random model write
    a well-formed call, or a malformed one (then it is content, as written), streamed or not."""
    good = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    broken = 'Let me see. <tool_call>\n{"name": "get_time", "arguments": {"zone": </tool_call>'
    for text, calls in ((good, [("get_time", '{"zone": "UTC"}')]), (broken, [])):
        kw = dict(tool_choice="auto", extra_body={"guided_choice": [text]}, max_tokens=60)
        whole = ask(client, **kw).choices[0]
        got = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
        assert got == calls and whole.finish_reason == ("tool_calls" if calls else "stop")
        assert whole.message.content == (None if calls else text)
        content, streamed_calls, finish = streamed(client, **kw)
        assert [(c["name"], c["arguments"]) for c in streamed_calls] == calls and finish == whole.finish_reason
        assert (content or None) == whole.message.content


# -- each family's grammar, end to end (the server's --tool-call-parser) -------------------------------------
@pytest.mark.parametrize("parser", ["llama3_json", "mistral", "hermes"])
def test_each_parser_reads_the_calls_its_grammar_forces(tools_llm, parser, client):
    from byzantium.server.app import build_app
    with serve(build_app({TOOLS_MODEL: tools_llm}, tool_parser=parser)) as url:
        other = client_of(url)
        reply = ask(other, tool_choice="required", parallel_tool_calls=False, seed=2)
        (call,) = reply.choices[0].message.tool_calls
        valid_call(call)
        content, calls, finish = streamed(other, tool_choice="required", parallel_tool_calls=False, seed=2)
        assert finish == "tool_calls" and [c["name"] for c in calls] == [call.function.name]


# -- refusals ------------------------------------------------------------------------------------------------
def test_a_template_without_tool_format_is_a_400(client):
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"  # renders no tools
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=4,
                                       extra_body={"chat_template_kwargs": {"chat_template": plain}})
    assert error.value.body["param"] == "tools" and "no tool format" in error.value.body["message"]
    # tool_choice "none": nothing to offer, nothing to read; a plain chat
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=4,
                                           extra_body={"chat_template_kwargs": {"chat_template": plain}})
    assert reply.choices[0].message.tool_calls is None


# -- the embedded model, with the shipped tools template -----------------------------------------------------
def test_embedded_model_round_trip_with_the_shipped_template(client):
    """SmolLM2's own template has no tool format: chats with tools render with the shipped one, a forced call
    is parsed, and the call and its answer reach the prompt of the next turn; chats without tools keep
    SmolLM2's own template."""
    from byzantium.engine.chat import render_chat
    tok = tokenizer_of(client)
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=80, seed=1,
                                           extra_body={"return_token_ids": True})
    (choice,) = reply.choices
    (call,) = choice.message.tool_calls
    arguments = valid_call(call)
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert "<tools>" in tok.decode(reply.prompt_token_ids) and '"get_time"' in tok.decode(reply.prompt_token_ids)
    answer = json.dumps({"result": 21})
    history = ASK + [choice.message, {"role": "tool", "tool_call_id": call.id, "content": answer}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=8,
                                            extra_body={"return_token_ids": True})
    prompt = tok.decode(second.prompt_token_ids)
    assert f'"name": "{call.function.name}", "arguments": {json.dumps(arguments)}' in prompt
    assert f"<tool_response>\n{answer}\n</tool_response>" in prompt
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, extra_body={"return_token_ids": True})
    assert plain.prompt_token_ids == render_chat(tok, ASK)


def test_the_serve_flag_replaces_the_chat_template(tmp_path):
    import argparse

    from byzantium.server.app import add_serve_args, read_chat_template
    ap = argparse.ArgumentParser()
    add_serve_args(ap)
    path = tmp_path / "t.jinja"
    path.write_text("{{ tools }}")
    assert read_chat_template(ap.parse_args(["--chat-template", str(path)]).chat_template) == "{{ tools }}"
    with pytest.raises(ValueError, match="cannot read"):
        read_chat_template(tmp_path / "missing.jinja")
    (tmp_path / "empty.jinja").write_text(" ")
    with pytest.raises(ValueError, match="empty"):
        read_chat_template(tmp_path / "empty.jinja")


def bad(client, param, **kw):
    kw.setdefault("tools", TOOLS)
    kw.setdefault("messages", ASK)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=TOOLS_MODEL, max_tokens=4, **kw)
    assert error.value.body["param"] == param, error.value.body
    return error.value.body["message"]


def test_bad_tool_requests_are_400s_naming_their_field(client):
    assert "needs tools" in bad(client, "tool_choice", tools=openai.NOT_GIVEN, tool_choice="required")
    assert "get_nothing" in bad(client, "tool_choice", tool_choice={"type": "function", "function": {"name": "get_nothing"}})
    bad(client, "tool_choice", tool_choice="sometimes")
    bad(client, "tool_choice", tool_choice={"type": "function"})
    bad(client, "tools", tools=[{"type": "retrieval", "function": {"name": "x"}}])
    bad(client, "tools", tools=[{"type": "function", "function": {"name": "has space"}}])
    bad(client, "tools", tools=[{"type": "function", "function": {"name": "f", "parameters": "not an object"}}])
    assert "twice" in bad(client, "tools", tools=[WEATHER, WEATHER])
    bad(client, "response_format", tool_choice="required", response_format={"type": "json_object"})
    bad(client, "messages[1].tool_call_id", messages=ASK + [{"role": "tool", "content": "x"}])
    bad(client, "messages", messages=ASK + [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                                                    "function": {"name": "f"}}]}])
    assert "cannot be enforced" in bad(client, "tools", tool_choice="required", tools=[
        {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}}}}])


# -- grammars and markers, without a server ------------------------------------------------------------------
def matcher(tokenizer, grammar):
    import llguidance
    import llguidance.hf
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer), eos_token=[2])
    return llguidance.LLMatcher(lltok, llguidance.grammar_from("grammar", grammar), log_level=1)


def accepts(m, ids):
    return all(m.consume_token(t) for t in ids) and m.is_accepting()


def test_markers_that_are_added_tokens_match_as_one_token(smollm2_dir):
    """Qwen's <tool_call> is an added token (not special), Mistral's [TOOL_CALLS] a special one: the
    grammar names each as its token (llguidance would not match them by text), and the special one is
    kept when decoding (decoding skips special tokens)."""
    from transformers import AutoTokenizer

    from byzantium.server.responses import decode_keeping
    from byzantium.server.tool_parsers import PARSERS, split
    from byzantium.server.tools import call_grammar, marker_tokens
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    hermes, mistral = PARSERS["hermes"], PARSERS["mistral"]
    assert marker_tokens(tok, hermes, special_only=True) == {} and len(marker_tokens(tok, hermes)) == 2
    assert list(marker_tokens(tok, mistral, special_only=True).values()) == ["[TOOL_CALLS]"]
    body = '{"name": "get_time", "arguments": {"zone": "CET"}}'
    ids = tok.encode(f"<tool_call>\n{body}\n</tool_call>")
    assert ids[0] == tok.convert_tokens_to_ids("<tool_call>")
    assert accepts(matcher(tok, call_grammar(hermes, [TIME], True, marker_tokens(tok, hermes))), ids)
    assert split(hermes, tok.decode(ids, skip_special_tokens=True))[1][0]["name"] == "get_time"

    keep = marker_tokens(tok, mistral, special_only=True)
    ids = tok.encode(f"[TOOL_CALLS][{body}]")
    assert ids[0] in keep and "[TOOL_CALLS]" not in tok.decode(ids, skip_special_tokens=True)
    assert accepts(matcher(tok, call_grammar(mistral, [TIME], True, keep)), ids)
    text = decode_keeping(tok, ids + [2], keep)  # the special marker kept, the eos skipped
    assert text == f"[TOOL_CALLS][{body}]" and split(mistral, text)[1][0]["name"] == "get_time"
    assert not accepts(matcher(tok, call_grammar(mistral, [TIME], True, keep)), tok.encode(f"[TOOL_CALLS][{body}, {body}]"))


def test_a_tool_takes_only_the_arguments_it_names(smollm2_dir):
    """Parameters that say nothing of other properties are read as a response_format schema is (strict):
    the call grammar refuses an argument the tool does not name, and takes it where the tool allows it."""
    from transformers import AutoTokenizer

    from byzantium.server.tool_parsers import PARSERS
    from byzantium.server.tools import call_grammar
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

    def takes(parameters, arguments):
        tool = {"type": "function", "function": {"name": "find", "parameters": parameters}}
        grammar = call_grammar(PARSERS["llama3_json"], [tool], True, {})
        return accepts(matcher(tok, grammar), tok.encode(json.dumps({"name": "find", "parameters": arguments})))

    assert takes(params, {"city": "Oslo"})
    assert not takes(params, {"city": "Oslo", "debug": 1})
    assert takes({**params, "additionalProperties": True}, {"city": "Oslo", "debug": 1})


def test_template_detection():
    from byzantium.server.tools import family, supports_tools, template_source

    class Tok:
        chat_template = {"default": "{{ messages }}", "tool_use": "{% for t in tools %}<tool_call>{% endfor %}"}
    source = template_source(Tok())
    assert supports_tools(source) and family(source) == "hermes"
    assert not supports_tools("{{ messages }} toolset") and not supports_tools(None)
    assert family("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]") == "mistral"
    assert family("Environment: ipython {{ tools }}") == "llama3_json" and family("{{ tools }}") is None
    assert template_source(Tok(), {"chat_template": "{{ tools }}"}) == "{{ tools }}"


def test_the_serve_flag_names_a_parser():
    import argparse

    from byzantium.server.app import add_serve_args
    from byzantium.server.state import Server
    ap = argparse.ArgumentParser()
    add_serve_args(ap)
    assert ap.parse_args(["--tool-call-parser", "mistral"]).tool_call_parser == "mistral"
    assert ap.parse_args([]).tool_call_parser is None
    with pytest.raises(SystemExit):
        ap.parse_args(["--tool-call-parser", "pythonic"])
    with pytest.raises(ValueError, match="unknown tool call parser"):
        Server({"m": None}, tool_parser="pythonic")


# -- forced calls end within max_tokens ----------------------------------------------------------------------
def least_call_tokens(tool):
    """Tokens of the shortest call to `tool` in the Hermes format (the closing's own reading of it)."""
    from byzantium.engine.json_closing import JsonPrefix
    from byzantium.engine.json_schema import closing
    from byzantium.server.tools import call_schema
    least = closing(JsonPrefix(), call_schema([tool], "arguments"))
    return len(tokenizer_of_model().encode(f"<tool_call>\n{least}\n</tool_call>"))


def tokenizer_of_model():
    from transformers import AutoTokenizer
    from byzantium.engine.loader import resolve_model
    return AutoTokenizer.from_pretrained(resolve_model(MODEL))


@pytest.mark.parametrize("parallel", [False, True])
def test_forced_calls_close_within_max_tokens(client, parallel):
    """Budgets from the shortest call's length up: a named call always comes back whole, and with
    `required` and parallel calls every call is whole and no cut markup is returned as content."""
    least = least_call_tokens(TIME)
    choice = {"type": "function", "function": {"name": "get_time"}} if not parallel else "required"
    for extra in (0, 3, 9, 17, 30):
        for seed in range(2):
            reply = ask(client, tools=[TIME], tool_choice=choice, parallel_tool_calls=parallel,
                        max_tokens=least + extra, seed=seed)
            (choice0,) = reply.choices
            assert choice0.message.content is None, (extra, choice0)
            # "length" where the budget closed the call early (as a JSON schema's answer closed so)
            assert choice0.message.tool_calls and choice0.finish_reason in ("tool_calls", "length"), (extra, choice0)
            for call in choice0.message.tool_calls:
                valid_call(call)
            assert reply.usage.completion_tokens <= least + extra
            streamed_content, calls, finish = streamed(client, tools=[TIME], tool_choice=choice,
                                                       parallel_tool_calls=parallel, max_tokens=least + extra, seed=seed)
            assert not streamed_content and finish == choice0.finish_reason
            assert [c["arguments"] for c in calls] == [c.function.arguments for c in choice0.message.tool_calls]


def test_a_budget_below_any_call_returns_no_markup(client):
    reply = ask(client, tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=12)
    (choice0,) = reply.choices
    assert choice0.message.content is None and not choice0.message.tool_calls and choice0.finish_reason == "length"


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
def test_every_prefix_of_calls_closes_into_calls(name):
    """call_closing, on each prefix of two calls as each family's grammar writes them, gives a text the
    family's parser reads as calls only (content None), each valid under its tool."""
    from byzantium.engine.tool_call_closing import call_format, call_closing
    from byzantium.server.tool_parsers import PARSERS, split
    from byzantium.server.tools import call_grammar
    parser = PARSERS[name]
    fmt = call_format(call_grammar(parser, TOOLS, False, {}))
    key = "parameters" if name == "llama3_json" else "arguments"
    calls = [{"name": "get_weather", key: {"city": 'Pa\u00efs "x"', "unit": "celsius"}},
             {"name": "get_time", key: {"zone": "CET"}}]
    if name == "mistral":
        text = fmt["start"] + json.dumps(calls, ensure_ascii=False)
    else:
        text = fmt["sep"].join(fmt["start"] + json.dumps(c, ensure_ascii=False) + fmt["end"] for c in calls)
    for k in range(len(text) + 1):
        closing = call_closing(fmt, text[:k])
        assert closing is not None, text[:k]
        content, got = split(parser, text[:k] + closing)
        assert content is None and got, text[:k] + closing
        for call in got:
            arguments = json.loads(call["arguments"])
            assert call["name"] in ("get_weather", "get_time") and isinstance(arguments, dict)


# -- markers that are one token each (Qwen's) ------------------------------------------------------------------
QWEN_TOOLS_MODEL = "tiny-qwen-tools"


@pytest.fixture(scope="module")
def qwen_dir(smollm2_dir, tmp_path_factory):
    """A tiny random Qwen2 whose tokenizer has <tool_call> and </tool_call> as added special tokens (one
    token each, as Qwen's has them), TEMPLATE as its chat template."""
    from transformers import AutoTokenizer
    path = tmp_path_factory.mktemp("tiny-qwen-tools")
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    build_tiny("qwen2", vocab_size=len(tok), bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def qwen_tools(qwen_dir):
    """(The tiny Qwen's tokenizer, a client of a server serving it.)"""
    from transformers import AutoTokenizer

    from byzantium.backends import LLMPool
    from byzantium.server.app import build_app
    pool = LLMPool("native", device="cpu", num_blocks=256, max_model_len=1024)
    try:
        with serve(build_app({QWEN_TOOLS_MODEL: pool.get(str(qwen_dir))})) as url:
            yield AutoTokenizer.from_pretrained(qwen_dir), client_of(url)
    finally:
        pool.close()


@pytest.mark.parametrize("parallel", [False, True])
def test_forced_calls_close_within_max_tokens_when_markers_are_tokens(qwen_tools, parallel):
    """As test_forced_calls_close_within_max_tokens, on a model whose call markers are one special token
    each: the closing writes a marker as its token, and reads it back from the output."""
    from byzantium.engine.json_closing import JsonPrefix
    from byzantium.engine.json_schema import closing
    from byzantium.server.tools import call_schema
    tok, client = qwen_tools
    assert len(tok.encode("<tool_call>", add_special_tokens=False)) == 1
    least_json = closing(JsonPrefix(), call_schema([TIME], "arguments"))
    least = len(tok.encode(f"<tool_call>\n{least_json}\n</tool_call>", add_special_tokens=False))
    choice = {"type": "function", "function": {"name": "get_time"}} if not parallel else "required"
    closed = 0
    for extra in (0, 9):
        for seed in range(2):
            reply = client.chat.completions.create(
                model=QWEN_TOOLS_MODEL, messages=ASK, temperature=1.0, tools=[TIME], tool_choice=choice,
                parallel_tool_calls=parallel, max_tokens=least + extra, seed=seed)
            (choice0,) = reply.choices
            assert choice0.message.content is None, (extra, choice0)
            assert choice0.message.tool_calls and choice0.finish_reason in ("tool_calls", "length"), (extra, choice0)
            for call in choice0.message.tool_calls:
                valid_call(call)
            assert reply.usage.completion_tokens <= least + extra
            closed += choice0.finish_reason == "length"
    assert closed > 0


def test_a_marker_token_is_written_as_that_token(qwen_dir):
    """The closing names a marker that is one token by its id (the call format carries it), not by its text:
    under a tokenizer that would split the marker's text (as one that never matches added tokens in text
    does), every prefix of a call still closes, each closing accepted by the grammar."""
    from byzantium.engine import grammar
    from byzantium.engine.tool_call_closing import ToolCallCloser, call_format
    from byzantium.server.tool_parsers import PARSERS
    from byzantium.server.tools import call_grammar, marker_tokens
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(qwen_dir)
    hermes = PARSERS["hermes"]
    text = call_grammar(hermes, [TIME], True, marker_tokens(tok, hermes))
    grammars = grammar.Grammars(tok, len(tok), {2})

    class SplittingTokenizer:  # the grammar engine's tokenizer, matching no added token in text
        def tokenize_str(self, s):
            return [i for char in s for i in grammars.tokenizer.tokenize_str(char)]

        def decode_bytes(self, ids):
            return grammars.tokenizer.decode_bytes(ids)

    ids = tok.encode('<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
                     add_special_tokens=False)
    marker = tok.convert_tokens_to_ids("<tool_call>")
    assert ids[0] == marker
    for cut in range(len(ids)):
        state = grammar.GrammarState(grammars.compile("grammar", text).deep_copy(),
                                     ToolCallCloser(SplittingTokenizer(), call_format(text), 2))
        for token in ids[:cut]:
            state.advance(token)
        closing = None
        for left in range(63, 0, -1):
            state.closer.wait = 0
            closing = state.closer.closing_tokens(ids[:cut], left) or closing
            if closing:
                break
        assert closing and state.valid_prefix(closing) == len(closing), (cut, closing)
        assert cut > 0 or closing[0] == marker
        for token in closing:
            state.advance(token)
        assert state.ended, tok.decode(ids[:cut] + closing)
