"""The server's edges of issue 45: the bound on a chat's messages (and the size check counting the whole
message, not its content only), `\\d` in a regex meaning ASCII digits, and requests given up before
their first engine step counted as aborts with their prompt tokens. On the embedded SmolLM2."""
import asyncio
import json
import re
import time

import pytest

openai = pytest.importorskip("openai")

from test_server import MAX_MODEL_LEN, MODEL, serve  # noqa: E402
from test_server import llm  # noqa: E402,F401  (the module's served model: the embedded SmolLM2)


@pytest.fixture(scope="module")
def client(llm):  # noqa: F811
    from byzantium.server.app import build_app
    with serve(build_app({MODEL: llm})) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


def refusal(client, messages):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    return error.value.body


def test_too_many_messages_is_a_400_naming_the_limit(client):
    from byzantium.server.state import MAX_MESSAGES
    limit = min(MAX_MESSAGES, MAX_MODEL_LEN)
    tiny = [{"role": "user" if i % 2 == 0 else "assistant", "content": "a"} for i in range(limit + 1)]
    body = refusal(client, tiny)
    assert body["param"] == "messages" and body["code"] == "too_many_messages"
    assert str(limit) in body["message"] and str(limit + 1) in body["message"]
    # at the limit, it is rendered (and here refused by the context it overflows, not by the count)
    body = refusal(client, tiny[:limit])
    assert body["code"] == "context_length_exceeded"


def test_the_size_check_counts_a_messages_calls_too(client, llm):  # noqa: F811
    from byzantium.server.state import Served
    token_chars = Served(MODEL, llm).token_chars
    call = {"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": json.dumps({"x": "y" * (MAX_MODEL_LEN * token_chars)})}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    body = refusal(client, messages)
    assert body["code"] == "context_length_exceeded" and "without being tokenized" in body["message"]


def test_regex_digits_are_ascii():
    """\\d and \\D read as Python's re reads them with re.ASCII, in and out of classes."""
    from byzantium.engine.grammar import ascii_digits
    cases = {r"\d{3}-\d{4}": ["123-4567", "١٢٣-٤٥٦٧", "12-4567"], r"[\d.]+": ["3.14", "٣.١"],
             r"[^\d]+": ["abc", "a1", "a٣"], r"\D\d": ["x1", "11", "x٣"], r"\\d": ["\\d", "1"]}
    for pattern, texts in cases.items():
        rewritten = ascii_digits(pattern)
        assert "\\d" not in rewritten.replace("\\\\", "") and "\\D" not in rewritten
        for text in texts:
            expected = re.fullmatch(pattern, text, re.ASCII) is not None
            assert (re.fullmatch(rewritten, text) is not None) == expected, (pattern, text)


def test_guided_regex_writes_ascii_digits(client, llm):  # noqa: F811
    pytest.importorskip("llguidance")
    for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2)):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "A phone number in Arabic-Indic digits?"}],
            max_tokens=20, temperature=temperature, seed=seed, extra_body={"guided_regex": r"\d{3}-\d{4}"})
        assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", reply.choices[0].message.content), reply.choices[0].message.content


def test_a_request_given_up_before_its_first_step_is_counted(llm):  # noqa: F811
    from byzantium import SamplingParams
    from byzantium.server.state import Server
    server = Server({MODEL: llm})
    served = server.model(MODEL)
    registry = server.metrics.registry
    labels = {"model_name": MODEL}

    def value(name, **extra):
        return registry.get_sample_value(name, {**labels, **extra}) or 0.0

    before = value("byzantium:request_success_total", finished_reason="abort"), value("byzantium:prompt_tokens_total")
    ids = list(range(100, 117))

    async def give_up():
        stream = server.tracked(served, ids, SamplingParams(max_tokens=50), time.perf_counter())
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the request is added; the engine has not stepped it yet
        assert not first.done()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await stream.aclose()
        while llm.engine.engine.has_work():  # its abort lands after the step under way
            await asyncio.sleep(0.01)

    asyncio.run(give_up())
    after = value("byzantium:request_success_total", finished_reason="abort"), value("byzantium:prompt_tokens_total")
    assert after[0] - before[0] == 1 and after[1] - before[1] == len(ids)
