"""The routes of the OpenAI-compatible server: /health, /metrics, /v1/models, /v1/completions,
/v1/chat/completions and our /v1/sessions, with the error handlers and the Guard middleware."""
from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .guard import Guard
from .responses import chat_logprobs, completion_logprobs, finish_reason, new_id
from .schemas import (APIError, ChatRequest, CompletionRequest, SessionAppend, SessionContinue, SessionOpen,
                      error_response, sampling_params, validation_error_response)
from .state import Server
from .streaming import stream_choices


def add_routes(app: FastAPI, server: Server):
    """The routes of `server` on `app`, with the error handlers that give every error OpenAI's shape."""
    # -- errors, key, body size ----------------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def api_error(request, error: APIError):
        return error_response(error.status, error.message, error.type, error.param, error.code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, error: RequestValidationError):
        return validation_error_response(error)

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
            params = [[sampling_params(body, body.max_tokens, body.logprobs, i) for i in range(body.n)] for _ in ids_list]
            tok = served.llm.tokenizer
            echo = [(tok.decode(ids) if tok is not None else "") if body.echo else "" for ids in ids_list]
            if body.stream:
                return done.stream(stream_choices(server, served, body, ids_list, params, "text_completion", echo))
            outs = await server.generate(served, request, ids_list, params)
            choices = []
            for i, out in enumerate(outs):
                choice = {"index": i, "text": echo[i // body.n] + out.text, "finish_reason": finish_reason(out.finish_reason),
                          "logprobs": None if body.logprobs is None else completion_logprobs(
                              tok, out.token_ids, out.logprobs, body.logprobs, body.return_tokens_as_token_ids)}
                if body.return_token_ids:
                    choice.update(token_ids=out.token_ids, prompt_token_ids=ids_list[i // body.n])
                choices.append(choice)
            return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
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
            params = [[sampling_params(body, max_tokens, top, i) for i in range(body.n)]]
            if body.stream:
                return done.stream(stream_choices(server, served, body, [ids], params, "chat.completion.chunk"))
            outs = await server.generate(served, request, [ids], params)
            choices = []
            for i, out in enumerate(outs):
                choice = {"index": i, "message": {"role": "assistant", "content": out.text},
                          "finish_reason": finish_reason(out.finish_reason),
                          "logprobs": None if top is None else chat_logprobs(
                              served.llm.tokenizer, out.token_ids, out.logprobs, top, body.return_tokens_as_token_ids)}
                if body.return_token_ids:
                    choice["token_ids"] = out.token_ids
                choices.append(choice)
            response = {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
                        "model": served.name, "choices": choices, "usage": server.count(served, outs, [len(ids)], body.n)}
            if body.return_token_ids:
                response["prompt_token_ids"] = ids
            return response

    # -- sessions (ours): an agent's context kept in the KV cache between turns ---------------------------------
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
        session_id = new_id("sess")
        server.sessions[session_id] = (served, session)
        return {"id": session_id, "object": "session", "model": served.name, "num_tokens": session.num_tokens}

    @app.post("/v1/sessions/{session_id}/append")
    async def append(session_id: str, body: SessionAppend):
        served, session = server.session(session_id)
        if (body.text is None) == (body.token_ids is None):
            raise APIError(400, "give either text or token_ids", param="text")
        try:
            added = await served.llm.extend(session, body.text if body.text is not None else body.token_ids)
        except ValueError as error:
            raise APIError(400, str(error), param="text" if body.text is not None else "token_ids")
        return {"id": session_id, "object": "session", "num_tokens": session.num_tokens, "appended": added}

    @app.post("/v1/sessions/{session_id}/continue")
    async def continue_session(session_id: str, body: SessionContinue, request: Request):
        served, session = server.session(session_id)
        with server.metrics.request(served.name, "sessions"):
            params = sampling_params(body, body.max_tokens, body.logprobs)
            server.admit(served)
            served.in_flight += 1
            try:
                out = (await served.engine.continue_([session], params, tag="turn"))[0]
            except ValueError as error:
                raise APIError(400, str(error), param="max_tokens")
            finally:
                served.in_flight -= 1
            choice = {"index": 0, "text": out.text, "finish_reason": finish_reason(out.finish_reason),
                      "token_ids": out.token_ids,
                      "logprobs": None if body.logprobs is None else completion_logprobs(
                          served.llm.tokenizer, out.token_ids, out.logprobs, body.logprobs,
                          body.return_tokens_as_token_ids)}
            return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
                    "model": served.name, "session": {"id": session_id, "num_tokens": session.num_tokens},
                    "choices": [choice], "usage": server.count(served, [out], [out.num_prompt_tokens], 1)}

    @app.delete("/v1/sessions/{session_id}")
    async def close_session(session_id: str):
        served, session = server.session(session_id)
        del server.sessions[session_id]
        await served.engine.close_session(session)
        return {"id": session_id, "object": "session", "deleted": True}
