"""The OpenAI-compatible server (byzantium/server/), end to end: the real server in a thread on the
embedded SmolLM2, spoken to with the official `openai` client (and raw HTTP for error bodies and SSE).

What it answers is checked against the same engine called in-process (never against fixed strings):
greedy text, logprobs, session turns. The engine is one NativeLLM shared by every app built here; it is
driven from one event loop at a time (see `wait_idle`)."""
import asyncio
import json
import re
import time

import pytest

openai = pytest.importorskip("openai")
httpx2 = pytest.importorskip("httpx2")

from byzantium import SamplingParams  # noqa: E402

MODEL = "smollm2-135m"
MAX_MODEL_LEN = 1024  # small, so a prompt past the context is cheap to send
ERROR_KEYS = {"message", "type", "param", "code"}


# -- fixtures and helpers ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm(smollm2_dir):
    from byzantium.backends import LLMPool
    pool = LLMPool("native", device="cpu", num_blocks=512, max_model_len=MAX_MODEL_LEN)
    yield pool.get(MODEL)
    pool.close()


def serve(app):
    from byzantium.server.app import ServerThread
    return ServerThread(app)


def build(llm, **kwargs):
    from byzantium.server.app import build_app
    return build_app({MODEL: llm}, **kwargs)


@pytest.fixture(scope="module")
def base_url(llm):
    with serve(build(llm)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="anything", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(base_url):
    with httpx2.Client(base_url=base_url, timeout=120) as c:
        yield c


def wait_idle(llm, timeout=10.0):
    """Wait until the engine holds no request and its stepping task has ended.

    The AsyncEngine steps on the event loop of whoever sent the first pending request: a server
    thread's loop, or asyncio.run below for in-process calls. These tests share one engine between
    several loops, which is only safe one loop at a time, so they wait for this between loops."""
    engine = llm.engine
    deadline = time.monotonic() + timeout
    while engine.engine.has_work() or (engine._loop_task is not None and not engine._loop_task.done()):
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.01)


def direct(llm, coro_fn):
    """Run `coro_fn()` (LLM calls) in-process on the shared engine, while the server is idle."""
    wait_idle(llm)
    try:
        return asyncio.run(coro_fn())
    finally:
        wait_idle(llm)


def greedy(max_tokens, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


def check_error(resp, status, *, param=None, code=None, type_=None):
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and ERROR_KEYS <= set(body["error"]), body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"], body
    if param is not None:
        assert err["param"] == param, body
    if code is not None:
        assert err["code"] == code, body
    if type_ is not None:
        assert err["type"] == type_, body
    return err


def sse_events(lines):
    """The data payloads of a server-sent event stream, in order ("[DONE]" kept as a string)."""
    events = []
    for line in lines:
        if line.startswith("data:"):
            data = line[len("data:"):].strip()
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def token_id(token):
    """A logprob token string under return_tokens_as_token_ids ("token_id:N") -> N."""
    m = re.fullmatch(r"token_id:(\d+)", token)
    assert m, token
    return int(m.group(1))


def top_ids(entry, k):
    """The k most likely token ids of an engine logprob entry ({token_id: logprob})."""
    return dict(sorted(entry.items(), key=lambda kv: -kv[1])[:k])


def metric_total(text, name):
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "The three primary colours are"


# -- discovery -------------------------------------------------------------------------------------------
def test_health_and_models(llm, http, client):
    r = http.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    raw = http.get("/v1/models").json()
    assert raw["object"] == "list"
    entry = raw["data"][0]
    assert entry["object"] == "model" and entry["owned_by"] == "byzantium" and isinstance(entry["created"], int)
    assert entry["max_model_len"] == llm.engine.engine.max_model_len == MAX_MODEL_LEN


# -- greedy answers equal the engine's -------------------------------------------------------------------
def test_completions_match_the_engine(llm, client):
    ids = llm.encode(PROMPT)
    text_resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    ids_resp = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0,
                                         extra_body={"return_token_ids": True})
    ref = direct(llm, lambda: llm.generate(ids, greedy(12)))
    for resp in (text_resp, ids_resp):
        assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
        (choice,) = resp.choices
        assert choice.index == 0 and choice.text == ref.text and choice.finish_reason == ref.finish_reason
        assert choice.logprobs is None
        assert resp.usage.prompt_tokens == len(ids)
        assert resp.usage.completion_tokens == len(ref.token_ids)
        assert resp.usage.total_tokens == len(ids) + len(ref.token_ids)
    extra = ids_resp.choices[0].model_extra
    assert extra["token_ids"] == ref.token_ids
    assert extra.get("prompt_token_ids", ids_resp.model_extra.get("prompt_token_ids")) in (ids, [ids])


def test_chat_matches_the_engine(llm, client):
    resp = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    ref = direct(llm, lambda: llm.chat(CHAT, greedy(12)))
    assert resp.object == "chat.completion"
    (choice,) = resp.choices
    assert choice.message.role == "assistant" and choice.message.content == ref.text
    assert choice.finish_reason == ref.finish_reason and choice.logprobs is None
    assert resp.usage.prompt_tokens == len(llm.render_chat(CHAT)) == ref.prompt_tokens
    assert resp.usage.completion_tokens == len(ref.token_ids)


# -- streaming --------------------------------------------------------------------------------------------
def test_streams_reassemble_to_the_plain_answer(client):
    kw = dict(model=MODEL, max_tokens=12, temperature=0, seed=3)
    plain = client.completions.create(prompt=PROMPT, **kw)
    chunks = list(client.completions.create(prompt=PROMPT, stream=True, stream_options={"include_usage": True}, **kw))
    text_chunks = [c for c in chunks if c.choices]
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in text_chunks) == plain.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and not chunks[-1].choices
    assert usage[0].completion_tokens == plain.usage.completion_tokens
    assert usage[0].prompt_tokens == plain.usage.prompt_tokens

    plain = client.chat.completions.create(messages=CHAT, **kw)
    chunks = list(client.chat.completions.create(messages=CHAT, stream=True, stream_options={"include_usage": True}, **kw))
    text_chunks = [c for c in chunks if c.choices]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert text_chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in text_chunks) == plain.choices[0].message.content
    assert text_chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == plain.usage.completion_tokens


def test_raw_stream_ends_with_done(http):
    body = dict(model=MODEL, messages=CHAT, max_tokens=6, temperature=0, stream=True)
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert all(isinstance(e, dict) and e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")


# -- sampling parameters ------------------------------------------------------------------------------------
def test_seeded_sampling_repeats_and_n_choices(client):
    kw = dict(model=MODEL, messages=CHAT, max_tokens=10, temperature=0.8, seed=1234)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    many = client.chat.completions.create(n=3, **kw)
    assert sorted(c.index for c in many.choices) == [0, 1, 2]
    assert all(c.message.role == "assistant" and c.finish_reason in ("stop", "length") for c in many.choices)
    assert many.usage.completion_tokens >= 3
    comps = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0.8, seed=5, n=3)
    assert sorted(c.index for c in comps.choices) == [0, 1, 2]


def test_stop_strings_and_token_limits(client):
    kw = dict(model=MODEL, prompt="Here is a list of fruits: apple, banana,", temperature=0)
    full = client.completions.create(max_tokens=16, extra_body={"ignore_eos": True}, **kw)
    text = full.choices[0].text
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 16
    words = [w for w in text.split() if text.find(w) > 0]
    assert words, text
    stop = words[len(words) // 2]
    cut = client.completions.create(max_tokens=16, stop=[stop], extra_body={"ignore_eos": True}, **kw)
    assert cut.choices[0].text == text[:text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"

    short = client.completions.create(max_tokens=5, extra_body={"ignore_eos": True}, **kw)
    assert short.usage.completion_tokens == 5 and short.choices[0].finish_reason == "length"
    assert text.startswith(short.choices[0].text)
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=4, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 4 and chat.choices[0].finish_reason == "length"


# -- logprobs ------------------------------------------------------------------------------------------------
def test_chat_logprobs_match_the_engine(llm, client):
    kw = dict(model=MODEL, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    resp = client.chat.completions.create(**kw)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    for entry in content:  # greedy: the chosen token is the most likely one
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)
        assert entry.logprob <= 0 and isinstance(entry.bytes, list)

    by_id = client.chat.completions.create(extra_body={"return_tokens_as_token_ids": True}, **kw)
    ref = direct(llm, lambda: llm.chat(CHAT, greedy(8, logprobs=3)))
    content = by_id.choices[0].logprobs.content
    assert [token_id(e.token) for e in content] == ref.token_ids
    for entry, tok, engine_lp in zip(content, ref.token_ids, ref.logprobs):
        assert entry.logprob == pytest.approx(engine_lp[tok], abs=1e-4)
        top = {token_id(t.token): t.logprob for t in entry.top_logprobs}
        want = top_ids(engine_lp, 3)
        assert set(top) == set(want)
        for t, lp in want.items():
            assert top[t] == pytest.approx(lp, abs=1e-4)


def test_completion_logprobs_match_the_engine(llm, client):
    ids = llm.encode(PROMPT)
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2,
                                     extra_body={"return_tokens_as_token_ids": True})
    ref = direct(llm, lambda: llm.generate(ids, greedy(8, logprobs=2)))
    lp = resp.choices[0].logprobs
    n = len(ref.token_ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert [token_id(t) for t in lp.tokens] == ref.token_ids
    assert lp.text_offset == sorted(lp.text_offset)
    for tok, value, top, engine_lp in zip(ref.token_ids, lp.token_logprobs, lp.top_logprobs, ref.logprobs):
        assert value == pytest.approx(engine_lp[tok], abs=1e-4)
        top = {token_id(t): v for t, v in top.items()}
        want = top_ids(engine_lp, 2)
        assert set(top) == set(want)
        for t, v in want.items():
            assert top[t] == pytest.approx(v, abs=1e-4)


# -- prefix cache ---------------------------------------------------------------------------------------------
def test_cached_tokens_reported_for_a_shared_prefix(llm, client):
    prefix = "Inventory of the north warehouse: " + ", ".join(f"crate {i} holds {i * 7 % 13} lamps" for i in range(12))
    assert len(llm.encode(prefix)) >= 3 * 16
    first = client.completions.create(model=MODEL, prompt=prefix + ". Question A:", max_tokens=2, temperature=0)
    second = client.completions.create(model=MODEL, prompt=prefix + ". Question B:", max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 2 * 16 and cached < second.usage.prompt_tokens


# -- request shapes other clients send ----------------------------------------------------------------------
def test_chat_template_kwargs_and_the_sac_reference_request(llm, client, http):
    kw = dict(model=MODEL, messages=CHAT, max_tokens=6, temperature=0)
    resp = client.chat.completions.create(extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kw)
    plain = client.chat.completions.create(**kw)
    assert resp.choices[0].message.content == plain.choices[0].message.content  # SmolLM2's template ignores it

    # Exactly what the SAC reference code posts (a raw JSON body, penalties 0, thinking off).
    sac = {"model": MODEL, "messages": [{"role": "system", "content": "You are a careful solver."},
                                        {"role": "user", "content": "What is 2 + 3? End with 'Answer: N'."}],
           "temperature": 0.7, "max_tokens": 8, "top_p": 0.95, "frequency_penalty": 0, "presence_penalty": 0,
           "seed": 42, "chat_template_kwargs": {"enable_thinking": False}}
    r = http.post("/v1/chat/completions", json=sac)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and isinstance(body["choices"][0]["message"]["content"], str)
    assert body["usage"]["completion_tokens"] >= 1

    # Fields this server does not implement are ignored, not refused.
    extra = dict(kw, user="agent-7", metadata={"run": "x"}, logit_bias={}, parallel_tool_calls=False,
                 service_tier="auto", store=False)
    r = http.post("/v1/chat/completions", json=extra)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == plain.choices[0].message.content


# -- errors ------------------------------------------------------------------------------------------------------
def test_unknown_model_is_404(client, http):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=2)
    check_error(http.post("/v1/completions", json={"model": "no-such-model", "prompt": "hi", "max_tokens": 2}),
                404, code="model_not_found")


def test_malformed_json_is_400(http):
    r = http.post("/v1/chat/completions", content=b'{"model": "smollm2-135m", "messages": [',
                  headers={"content-type": "application/json"})
    check_error(r, 400, type_="invalid_request_error")


@pytest.mark.parametrize("endpoint,field,value", [
    ("chat", "temperature", -1), ("chat", "max_tokens", 0), ("chat", "max_completion_tokens", 0), ("chat", "n", 0),
    ("chat", "top_p", 0), ("chat", "frequency_penalty", 3.0), ("chat", "presence_penalty", -2.5),
    ("chat", "messages", []), ("chat", "top_logprobs", -1),
    ("completions", "max_tokens", 0), ("completions", "temperature", -1), ("completions", "n", 0),
    ("completions", "logprobs", -1),
])
def test_bad_parameter_is_400_naming_it(http, endpoint, field, value):
    body = {"model": MODEL, "max_tokens": 2, field: value}
    body.update({"messages": CHAT} if endpoint == "chat" and field != "messages" else {})
    body.update({"prompt": PROMPT} if endpoint == "completions" else {})
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    check_error(http.post(path, json=body), 400, param=field, type_="invalid_request_error")


def test_echo_and_penalties(llm, client, http):
    # The contract first said echo is refused; the server implements it (prompt text + completion), with
    # logprobs too (vLLM's shape). Penalties are implemented (OpenAI's range [-2, 2]).
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    plain = client.completions.create(**kw)
    echoed = client.completions.create(echo=True, **kw)
    assert echoed.choices[0].text == llm.decode(llm.encode(PROMPT)) + plain.choices[0].text
    # echo with logprobs (lm-eval's local-completions): the prompt's own log-probabilities, the first null,
    # computed in the prefill; they equal the decode path's for the same tokens
    ids = llm.encode(PROMPT)
    gen = http.post("/v1/completions", json=dict(kw, prompt=ids, logprobs=1)).json()["choices"][0]["logprobs"]
    gen_ids = ids + [int(t) for t in llm.encode(plain.choices[0].text)]
    r = http.post("/v1/completions", json=dict(kw, prompt=gen_ids, max_tokens=0, echo=True, logprobs=1))
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == len(gen_ids)
    assert all(x <= 0 for x in lp["token_logprobs"][1:])
    n = len(gen_ids) - len(ids)
    assert n == len(gen["token_logprobs"]) and lp["tokens"][len(ids):] == gen["tokens"]  # the same tokens re-read
    assert lp["token_logprobs"][len(ids):] == pytest.approx(gen["token_logprobs"], abs=1e-4)
    check_error(http.post("/v1/completions", json=dict(kw, max_tokens=0)), 400)  # nothing asked of a 0 budget
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 4, "temperature": 0,
                                                "frequency_penalty": 0.5, "presence_penalty": 0.5})
    assert r.status_code == 200, r.text


def test_chat_prompt_logprobs_equal_the_completions_path(http):
    """vLLM's prompt_logprobs on a chat: the rendered prompt's tokens' log-probabilities (the first null),
    in the response (vLLM's place on chat), equal to those of /v1/completions on the same token ids."""
    kw = dict(model=MODEL, max_tokens=3, temperature=0, prompt_logprobs=2)
    r = http.post("/v1/chat/completions", json=dict(kw, messages=CHAT, n=2, return_token_ids=True))
    assert r.status_code == 200, r.text
    chat = r.json()
    ids, got = chat["prompt_token_ids"], chat["prompt_logprobs"]
    assert all("prompt_logprobs" not in c for c in chat["choices"])
    r = http.post("/v1/completions", json=dict(kw, prompt=ids))
    assert r.status_code == 200, r.text
    want = r.json()["choices"][0]["prompt_logprobs"]
    assert len(got) == len(want) == len(ids) and got[0] is None and want[0] is None
    for token, entry, expected in zip(ids[1:], got[1:], want[1:]):
        assert str(token) in entry and 2 <= len(entry) <= 3 and set(entry) == set(expected)
        for key, value in expected.items():
            assert entry[key]["logprob"] == pytest.approx(value["logprob"], abs=1e-4)
            assert entry[key]["decoded_token"] == value["decoded_token"]
    check_error(http.post("/v1/chat/completions", json=dict(kw, messages=CHAT, stream=True)), 400, param="stream")


def test_prompt_past_the_context_is_400(llm, http, client):
    long_ids = (llm.encode(PROMPT) * MAX_MODEL_LEN)[:MAX_MODEL_LEN + 10]
    check_error(http.post("/v1/completions", json={"model": MODEL, "prompt": long_ids, "max_tokens": 2}),
                400, code="context_length_exceeded")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=long_ids, max_tokens=2)
    words = " ".join(["lamp"] * (MAX_MODEL_LEN + 50))
    check_error(http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2,
                                                         "messages": [{"role": "user", "content": words}]}),
                400, code="context_length_exceeded")


def test_api_key(llm):
    with serve(build(llm, api_key="secret")) as url, httpx2.Client(base_url=url, timeout=60) as http:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        check_error(http.post("/v1/completions", json=body), 401, code="invalid_api_key")
        check_error(http.post("/v1/completions", json=body, headers={"Authorization": "Bearer wrong"}),
                    401, code="invalid_api_key")
        check_error(http.get("/v1/models"), 401, code="invalid_api_key")
        assert http.get("/health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=url + "/v1", api_key="secret", max_retries=0, timeout=60)
        assert ok.completions.create(**body).choices[0].finish_reason in ("stop", "length")
    wait_idle(llm)


def test_body_over_the_limit_is_413(llm):
    with serve(build(llm, max_body_bytes=2000)) as url, httpx2.Client(base_url=url, timeout=60) as http:
        big = {"model": MODEL, "prompt": "lamp " * 1000, "max_tokens": 2}
        check_error(http.post("/v1/completions", json=big), 413)
        small = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        assert http.post("/v1/completions", json=small).status_code == 200
    wait_idle(llm)


def test_full_queue_is_429_and_everyone_else_is_answered(llm):
    # A long prefill holds the engine for a step (seconds on a CPU); a burst that arrives meanwhile waits
    # for that step to end, and with max_waiting=1 all but the first of the burst are turned away.
    long_ids = [100 + (i * 37) % 5000 for i in range(900)]

    async def flood(url):
        async with httpx2.AsyncClient(base_url=url, timeout=120) as http:
            long = asyncio.create_task(http.post("/v1/completions", json={
                "model": MODEL, "prompt": long_ids, "max_tokens": 2, "temperature": 0}))
            deadline = time.monotonic() + 30
            while llm.engine.num_running == 0 and not long.done():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            burst = await asyncio.gather(*(http.post("/v1/completions", json={
                "model": MODEL, "prompt": f"Count from {i}:", "max_tokens": 4, "temperature": 0}) for i in range(16)))
            return [await long, *burst]

    with serve(build(llm, max_waiting=1)) as url:
        responses = asyncio.run(flood(url))
    wait_idle(llm)
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    # The burst arrives within tens of milliseconds, inside the long step: one of it may wait (two for slack,
    # should the step end mid-burst), every other one is refused at once.
    assert statuses[0] == 200 and 1 <= statuses[1:].count(200) <= 2, statuses
    for r in responses:
        if r.status_code == 429:
            check_error(r, 429, code="rate_limit_exceeded")
        else:
            assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_still_answers_after_the_errors(llm, client):
    wait_idle(llm)
    resp = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0)
    assert resp.choices[0].finish_reason in ("stop", "length") and resp.usage.completion_tokens >= 1


# -- concurrency -----------------------------------------------------------------------------------------------
def test_concurrent_clients_share_steps(llm, base_url):
    async def clients(n):
        aclient = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(aclient.chat.completions.create(
                model=MODEL, max_tokens=8, temperature=0.7, seed=i,
                messages=[{"role": "user", "content": f"Client {i}: name a number bigger than {i}."}])
                for i in range(n)))
        finally:
            await aclient.close()

    wait_idle(llm)
    llm.reset_stats()
    answers = asyncio.run(clients(64))
    assert len(answers) == 64
    assert all(a.choices[0].finish_reason in ("stop", "length") and a.usage.completion_tokens >= 1 for a in answers)
    assert llm.stats["max_batch_seqs"] >= 8, llm.stats


def test_dropped_stream_frees_its_blocks(llm, http):
    wait_idle(llm)
    blocks = llm.engine.engine.block_manager
    before = blocks.num_used
    body = {"model": MODEL, "prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 400,
            "temperature": 0, "stream": True, "ignore_eos": True}
    got = 0
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:"):
                got += 1
                if got == 2:
                    break
        assert blocks.num_used > before  # the request is running and holds blocks
    deadline = time.monotonic() + 5
    while blocks.num_used != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert blocks.num_used == before
    wait_idle(llm)


# -- metrics -------------------------------------------------------------------------------------------------------
def test_metrics(client, http):
    text = http.get("/metrics").text
    for name in ("http_requests_total", "prompt_tokens_total", "prefix_cache_hits_total", "generation_tokens_total",
                 "num_requests_running", "num_requests_waiting", "kv_blocks_used", "step_seconds_total"):
        assert re.search(rf"^byzantium:{name}[ {{]", text, re.M), name
    assert re.search(r'^byzantium:step_seconds_total\{[^}]*phase="decode"', text, re.M)
    assert re.search(r'^byzantium:generation_tokens_total\{[^}]*model_name="smollm2-135m"', text, re.M)
    before = metric_total(text, "byzantium:http_requests_total")
    generated = metric_total(text, "byzantium:generation_tokens_total")
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert metric_total(r.text, "byzantium:http_requests_total") >= before + 1
    assert metric_total(r.text, "byzantium:generation_tokens_total") >= generated + 1


# -- sessions (our extension) ----------------------------------------------------------------------------------------
def test_sessions_keep_their_cache_and_match_the_engine(llm, http):
    messages = [{"role": "user", "content": "Let us write a story together. Begin it."}]
    appended = " Then a dragon arrived."
    blocks = llm.engine.engine.block_manager
    wait_idle(llm)
    before = blocks.num_used

    r = http.post("/v1/sessions", json={"model": MODEL, "messages": messages})
    assert r.status_code == 200, r.text
    opened = r.json()
    sid = opened["id"]
    assert sid.startswith("sess-") and opened["object"] == "session" and opened["model"] == MODEL
    assert opened["num_tokens"] == len(llm.render_chat(messages))
    first = http.post(f"/v1/sessions/{sid}/continue", json={"max_tokens": 8, "temperature": 0})
    assert first.status_code == 200, first.text
    first = first.json()
    assert first["object"] == "text_completion"
    grown = opened["num_tokens"] + len(first["choices"][0]["token_ids"])
    r = http.post(f"/v1/sessions/{sid}/append", json={"text": appended})
    assert r.status_code == 200, r.text
    added = r.json()
    assert added["id"] == sid and added["num_tokens"] == grown + added["appended"] and added["appended"] >= 1
    second = http.post(f"/v1/sessions/{sid}/continue", json={"max_tokens": 8, "temperature": 0})
    assert second.status_code == 200, second.text
    second = second.json()

    async def reference():
        session = await llm.open_session(messages)
        a = await llm.continue_(session, greedy(8))
        await llm.extend(session, appended)
        b = await llm.continue_(session, greedy(8))
        await llm.close_session(session)
        return a, b

    ref_a, ref_b = direct(llm, reference)
    assert first["choices"][0]["text"] == ref_a.text and first["choices"][0]["token_ids"] == ref_a.token_ids
    assert second["choices"][0]["text"] == ref_b.text and second["choices"][0]["token_ids"] == ref_b.token_ids
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Only the appended tokens (and the last generated one, never fed back) are prefilled.
    assert cached == ref_b.cached_tokens and cached >= grown - 1
    assert blocks.num_used > before

    r = http.delete(f"/v1/sessions/{sid}")
    assert r.status_code == 200 and r.json()["id"] == sid and r.json()["deleted"] is True
    wait_idle(llm)
    assert blocks.num_used == before
    check_error(http.post(f"/v1/sessions/{sid}/continue", json={"max_tokens": 2}), 404)
    check_error(http.post(f"/v1/sessions/{sid}/append", json={"text": "x"}), 404)
    check_error(http.delete(f"/v1/sessions/{sid}"), 404)
    check_error(http.post("/v1/sessions/sess-nope/continue", json={"max_tokens": 2}), 404)


def test_several_models_routed_by_name(llm, tiny_llama):
    """Two models in one server: each request goes to the engine its `model` names."""
    from byzantium.backends import load_llm
    from byzantium.server.app import build_app
    model, path = tiny_llama
    tiny = load_llm(path, num_blocks=64)
    try:
        wait_idle(llm)
        with serve(build_app({MODEL: llm, "tiny": tiny})) as url:
            c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
            assert sorted(m.id for m in c.models.list().data) == sorted([MODEL, "tiny"])
            prompt = [5, 17, 42, 99, 3]
            got = c.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                       extra_body={"return_token_ids": True})
            want = tiny.engine.engine.generate([prompt], SamplingParams(max_tokens=6))[0]
            assert got.choices[0].model_extra["token_ids"] == want.token_ids
            assert got.usage.prompt_tokens == len(prompt) and got.model == "tiny"
            text = c.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0).choices[0].text
            assert text == direct(llm, lambda: llm.generate("1, 2, 3,", greedy(4))).text
            # the tiny model has no tokenizer: a chat to it is a clear 400, the other model keeps serving
            with pytest.raises(openai.BadRequestError, match="no tokenizer"):
                c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        wait_idle(tiny)
    finally:
        tiny.close()
