"""The routes of the OpenAI-compatible server (server.py builds the app and holds the request logic)."""
from __future__ import annotations

import asyncio
import secrets
import time
import weakref

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .server import (APIError, ChatRequest, CompletionRequest, Server, SessionAppend, SessionContinue, SessionOpen,
                     TextStream, chat_logprobs, completion_logprobs, error_response, sse)


def _new_id(prefix):
    return f"{prefix}-{secrets.token_hex(12)}"


def _finish(reason):
    return "length" if reason == "length" else "stop"


class Guard:
    """ASGI middleware: the API key on /v1 routes, and the body size limit (413) before anything is parsed."""

    def __init__(self, app, server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        server, headers = self.server, dict(scope["headers"])
        if server.api_key is not None and scope["path"].startswith("/v1"):
            given = headers.get(b"authorization", b"")
            if not secrets.compare_digest(given, f"Bearer {server.api_key}".encode()):
                return await error_response(401, "Incorrect or missing API key: send `Authorization: Bearer KEY`",
                                            code="invalid_api_key")(scope, receive, send)
        limit = server.max_body_bytes
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await self._too_large(int(length), scope, receive, send)
        if length is None and scope["method"] in ("POST", "PUT"):  # chunked: read it all first, then judge
            chunks, size, more = [], 0, True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    break
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                more = message.get("more_body", False)
                if size > limit:
                    return await self._too_large(size, scope, receive, send)
            body, original = b"".join(chunks), receive

            async def receive():
                nonlocal body
                if body is not None:
                    message, body = {"type": "http.request", "body": body, "more_body": False}, None
                    return message
                return await original()
        return await self.app(scope, receive, send)

    async def _too_large(self, size, scope, receive, send):
        response = error_response(413, f"the request body has {size} bytes or more; the limit is "
                                       f"{self.server.max_body_bytes}", code="request_too_large")
        await response(scope, receive, send)


def add_routes(app: FastAPI, server: Server):
    # -- errors, key, body size ----------------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def api_error(request, error: APIError):
        return error_response(error.status, error.message, error.type, error.param, error.code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, error: RequestValidationError):
        first = error.errors()[0] if error.errors() else {}
        if first.get("type") == "json_invalid":
            return error_response(400, f"malformed JSON in the request body: {first.get('msg', '')}")
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = loc[0] if loc else None
        where = ".".join(loc) if loc else "the request body"
        return error_response(400, f"{where}: {first.get('msg', 'invalid value')}", param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, error):
        return error_response(error.status_code, str(error.detail), code=None)

    app.add_middleware(Guard, server=server)

    # -- plain routes --------------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        body, content_type = server.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [
            {"id": s.name, "object": "model", "created": s.created, "owned_by": "byzantium",
             "max_model_len": s.max_model_len} for s in server.models.values()]}

    # -- completions ---------------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        served = server.model(body.model)
        with server.metrics.request(served.name, "completions") as done:
            ids_list = server.completion_prompts(served, body)
            for ids in ids_list:
                server.check_length(served, ids, body.max_tokens, "prompt")
            if body.echo and body.logprobs is not None:
                raise APIError(400, "echo with logprobs is not supported", param="echo")
            params = [[server.params(body, body.max_tokens, body.logprobs, i) for i in range(body.n)] for _ in ids_list]
            tok = served.llm.tokenizer
            echo = [(tok.decode(ids) if tok is not None else "") if body.echo else "" for ids in ids_list]
            if body.stream:
                return done.stream(stream_choices(served, request, body, ids_list, params, "text_completion", echo))
            outs = await server.generate(served, request, ids_list, params)
            choices = []
            for i, out in enumerate(outs):
                choice = {"index": i, "text": echo[i // body.n] + out.text, "finish_reason": _finish(out.finish_reason),
                          "logprobs": None if body.logprobs is None else completion_logprobs(
                              tok, out.token_ids, out.logprobs, body.logprobs, body.return_tokens_as_token_ids)}
                if body.return_token_ids:
                    choice.update(token_ids=out.token_ids, prompt_token_ids=ids_list[i // body.n])
                choices.append(choice)
            return {"id": _new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
                    "model": served.name, "choices": choices,
                    "usage": server.count(served, outs, [len(ids) for ids in ids_list], body.n)}

    # -- chat ------------------------------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        served = server.model(body.model)
        with server.metrics.request(served.name, "chat") as done:
            ids = server.chat_ids(served, body.messages, body.chat_template_kwargs)
            max_tokens = body.max_completion_tokens or body.max_tokens
            server.check_length(served, ids, max_tokens, "messages")
            if max_tokens is None:  # as much as the context and the KV pool leave (OpenAI: no default cap)
                engine = served.engine.engine
                max_tokens = min(served.max_model_len, engine.num_blocks * engine.block_size) - len(ids)
            top = (body.top_logprobs or 0) if body.logprobs else None
            if body.top_logprobs and not body.logprobs:
                raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
            params = [[server.params(body, max_tokens, top, i) for i in range(body.n)]]
            if body.stream:
                return done.stream(stream_choices(served, request, body, [ids], params, "chat.completion.chunk"))
            outs = await server.generate(served, request, [ids], params)
            choices = []
            for i, out in enumerate(outs):
                choice = {"index": i, "message": {"role": "assistant", "content": out.text},
                          "finish_reason": _finish(out.finish_reason),
                          "logprobs": None if top is None else chat_logprobs(
                              served.llm.tokenizer, out.token_ids, out.logprobs, top, body.return_tokens_as_token_ids)}
                if body.return_token_ids:
                    choice["token_ids"] = out.token_ids
                choices.append(choice)
            response = {"id": _new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
                        "model": served.name, "choices": choices, "usage": server.count(served, outs, [len(ids)], body.n)}
            if body.return_token_ids:
                response["prompt_token_ids"] = ids
            return response

    def stream_choices(served, request, body, ids_list, params, object_name, echo=None):
        """Server-sent events for every (prompt, choice): chunks as tokens arrive, then usage, then [DONE].
        Closing the response early (a client gone) closes every choice's engine stream: aborted, freed."""
        chat = object_name == "chat.completion.chunk"
        rid, created = _new_id("chatcmpl" if chat else "cmpl"), int(time.time())
        count = sum(len(p) for p in params)
        server.admit(served, count)
        served.in_flight += count  # reserved now, so that a burst of streams cannot all pass admit
        released = False

        def release():  # once: when the stream ends, or when a stream never started is dropped
            nonlocal released
            if not released:
                released, served.in_flight = True, served.in_flight - count
        queue = asyncio.Queue()
        tok = served.llm.tokenizer
        top = params[0][0].logprobs

        async def run(index, ids, p):
            text = TextStream(tok, p.stop)
            sent_tokens = 0
            try:
                async for seq in served.engine.stream(ids, p, tag="serve"):
                    ended = seq.finish_reason is not None
                    out = served.engine.output(seq) if ended else None
                    token_ids = list(seq.output_ids)
                    delta = text.delta(token_ids, out.text if ended else None)
                    new_tokens, sent_tokens = token_ids[sent_tokens:], len(token_ids)
                    if delta or ended or (top is not None and new_tokens):
                        logprobs = None
                        if top is not None:
                            lps = list(seq.logprobs)[len(token_ids) - len(new_tokens):len(token_ids)]
                            as_ids = body.return_tokens_as_token_ids
                            logprobs = (chat_logprobs(tok, new_tokens, lps, top, as_ids) if chat else
                                        completion_logprobs(tok, new_tokens, lps, top, as_ids, len(text.sent) - len(delta)))
                        await queue.put((index, delta, _finish(seq.finish_reason) if ended else None, logprobs,
                                         new_tokens, out))
            except Exception as error:  # noqa: BLE001 - reported in the stream, the others go on
                await queue.put((index, None, "error", str(error), [], None))
            finally:
                await queue.put((index, None, None, None, None, "end"))

        def chunk(choices, usage=None):
            data = {"id": rid, "object": object_name, "created": created, "model": served.name, "choices": choices}
            if usage is not None:
                data["usage"] = usage
            return sse(data)

        async def events():
            n = len(params[0])
            tasks = []
            for i, (ids, ps) in enumerate(zip(ids_list, params)):
                for j, p in enumerate(ps):
                    tasks.append(asyncio.create_task(run(i * n + j, ids, p)))
            outs, running = {}, len(tasks)
            try:
                if chat:
                    yield chunk([{"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None} for k in range(len(tasks))])
                elif echo and any(echo):
                    yield chunk([{"index": k, "text": echo[k // n], "logprobs": None, "finish_reason": None}
                                 for k in range(len(tasks))])
                while running:
                    index, delta, finish, logprobs, new_tokens, out = await queue.get()
                    if out == "end":
                        running -= 1
                        continue
                    if finish == "error":
                        yield sse({"error": {"message": logprobs, "type": "server_error", "param": None, "code": None}})
                        continue
                    if out is not None:
                        outs[index] = out
                    if chat:
                        choice = {"index": index, "delta": {"content": delta} if delta else {}, "logprobs": logprobs,
                                  "finish_reason": finish}
                    else:
                        choice = {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish}
                    if body.return_token_ids:
                        choice["token_ids"] = new_tokens
                    yield chunk([choice])
                if len(outs) == len(tasks):
                    usage = server.count(served, [outs[k] for k in range(len(tasks))],
                                         [len(ids) for ids in ids_list], n)
                    if (body.stream_options or {}).get("include_usage"):
                        yield chunk([], usage)
                yield "data: [DONE]\n\n"
            finally:
                release()
                for task in tasks:
                    task.cancel()

        stream = events()
        weakref.finalize(stream, release)
        return stream

    # -- sessions (ours): an agent's context kept in the KV cache between turns ---------------------------------
    def session_of(session_id):
        if session_id not in server.sessions:
            raise APIError(404, f"no session `{session_id}` (closed, or never opened)", param="session_id",
                           code="session_not_found")
        return server.sessions[session_id]

    @app.post("/v1/sessions")
    async def open_session(body: SessionOpen):
        served = server.model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give either prompt or messages", param="prompt")
        if len(server.sessions) >= server.max_sessions:
            raise APIError(429, f"{len(server.sessions)} sessions are open (limit {server.max_sessions}); close some",
                           type="rate_limit_exceeded", code="rate_limit_exceeded")
        if body.messages is not None:
            ids = server.chat_ids(served, body.messages, body.chat_template_kwargs)
        else:
            try:
                ids = served.engine.engine.encode(body.prompt)
            except ValueError as error:
                raise APIError(400, str(error), param="prompt")
        server.check_length(served, ids, None, "prompt")
        session = await served.engine.open_session(ids, tag="session")
        session_id = _new_id("sess")
        server.sessions[session_id] = (served, session)
        return {"id": session_id, "object": "session", "model": served.name, "num_tokens": session.num_tokens}

    @app.post("/v1/sessions/{session_id}/append")
    async def append(session_id: str, body: SessionAppend):
        served, session = session_of(session_id)
        if (body.text is None) == (body.token_ids is None):
            raise APIError(400, "give either text or token_ids", param="text")
        try:
            added = await served.llm.extend(session, body.text if body.text is not None else body.token_ids)
        except ValueError as error:
            raise APIError(400, str(error), param="text" if body.text is not None else "token_ids")
        return {"id": session_id, "object": "session", "num_tokens": session.num_tokens, "appended": added}

    @app.post("/v1/sessions/{session_id}/continue")
    async def continue_session(session_id: str, body: SessionContinue, request: Request):
        served, session = session_of(session_id)
        with server.metrics.request(served.name, "sessions"):
            params = server.params(body, body.max_tokens, body.logprobs)
            server.admit(served)
            served.in_flight += 1
            try:
                out = (await served.engine.continue_([session], params, tag="turn"))[0]
            except ValueError as error:
                raise APIError(400, str(error), param="max_tokens")
            finally:
                served.in_flight -= 1
            choice = {"index": 0, "text": out.text, "finish_reason": _finish(out.finish_reason),
                      "token_ids": out.token_ids,
                      "logprobs": None if body.logprobs is None else completion_logprobs(
                          served.llm.tokenizer, out.token_ids, out.logprobs, body.logprobs,
                          body.return_tokens_as_token_ids)}
            return {"id": _new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
                    "model": served.name, "session": {"id": session_id, "num_tokens": session.num_tokens},
                    "choices": [choice], "usage": server.count(served, [out], [out.num_prompt_tokens], 1)}

    @app.delete("/v1/sessions/{session_id}")
    async def close_session(session_id: str):
        served, session = session_of(session_id)
        del server.sessions[session_id]
        await served.engine.close_session(session)
        return {"id": session_id, "object": "session", "deleted": True}
