"""The routes of the OpenAI-compatible server: /health, /metrics, /v1/models, /v1/completions,
/v1/chat/completions and our /v1/sessions, with the error handlers and the Guard middleware."""
from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .guard import ARRIVAL, Guard
from .responses import (chat_logprobs, completion_logprobs, echo_logprobs, finish_reason, new_id, output_text,
                        vllm_prompt_logprobs)
from .schemas import (APIError, ChatRequest, CompletionRequest, DetokenizeRequest, SessionAppend, SessionContinue,
                      SessionOpen, TokenizeRequest, error_response, sampling_params, validation_error_response)
from .state import Server
from .streaming import stream_choices
from .tool_parsers import parse_output
from .tools import plan


def arrival_of(request: Request):
    """When the request reached the server (the Guard's clock), for the latency metrics."""
    return request.scope.get(ARRIVAL) or time.perf_counter()


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

    @app.exception_handler(Exception)
    async def server_error(request, error):  # a bug, or an engine failure: OpenAI's shape, never plain text
        return error_response(500, f"the server failed on this request: {type(error).__name__}: {error}",
                              type="server_error")

    app.add_middleware(Guard, server=server)

    def sse_response(events):
        return StreamingResponse(events, media_type="text/event-stream")

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
        return {"object": "list", "data": [s.card() for s in server.models.values()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        return server.model(model_id).card()

    # -- vLLM's tokenizer routes (lm-eval's local-completions probes them) ---------------------------------
    def served_tokenizer(name):
        if name is None and len(server.models) > 1:
            raise APIError(400, f"name the model: this server serves {', '.join(server.models)}", param="model")
        served = server.model(name if name is not None else next(iter(server.models)))
        if served.llm.tokenizer is None:
            raise APIError(400, f"model {served.name} has no tokenizer", param="model")
        return served, served.llm.tokenizer

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        served, tok = served_tokenizer(body.model)
        server.check_chars(served, len(body.prompt), "prompt")
        ids = await served.on_worker(lambda: tok.encode(body.prompt, add_special_tokens=body.add_special_tokens))
        return {"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        served, tok = served_tokenizer(body.model)
        vocab = served.engine.engine.config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="tokens")
        return {"prompt": await served.on_worker(lambda: tok.decode(body.tokens))}

    # -- completions ---------------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        served, arrival = server.model(body.model), arrival_of(request)
        asked = body.prompt_logprobs_asked()  # computed in the batched prefill, prefix cache capped (README)
        if body.stream and asked is not None:
            raise APIError(400, "prompt log-probabilities (echo with logprobs, prompt_logprobs, max_tokens 0) "
                                "are not streamed; send stream: false", param="stream")
        if body.max_tokens == 0 and not body.echo and body.prompt_logprobs is None:
            raise APIError(400, "max_tokens 0 needs echo or prompt_logprobs (nothing would be returned)",
                           param="max_tokens")
        sampling_params(body, body.max_tokens, body.logprobs, body.n - 1, prompt_logprobs=asked)  # 400 before tokenizing
        ids_list = await server.completion_prompts(served, body)
        params = [[sampling_params(body, body.max_tokens, body.logprobs, i, prompt_logprobs=asked)
                   for i in range(body.n)] for _ in ids_list]
        tok = served.llm.tokenizer
        echo = [""] * len(ids_list)
        if body.echo and tok is not None:
            echo = await served.on_worker(lambda: [tok.decode(ids) for ids in ids_list])
        if body.stream:
            return sse_response(stream_choices(server, served, body, ids_list, params, "text_completion", arrival, echo))
        outs = await server.generate(served, request, ids_list, params, arrival)
        choices = []
        for i, out in enumerate(outs):
            choice = {"index": i, "text": echo[i // body.n] + out.text, "finish_reason": finish_reason(out.finish_reason),
                      "logprobs": None if body.logprobs is None else completion_logprobs(
                          tok, out.token_ids, out.logprobs, body.logprobs, body.return_tokens_as_token_ids)}
            if body.echo and body.logprobs is not None:  # the prompt's tokens first, then the generated ones
                head, offset = echo_logprobs(tok, ids_list[i // body.n], out.prompt_logprobs,
                                             body.return_tokens_as_token_ids)
                tail = completion_logprobs(tok, out.token_ids, out.logprobs, body.logprobs,
                                           body.return_tokens_as_token_ids, offset)
                choice["logprobs"] = {key: head[key] + tail[key] for key in head}
            if body.prompt_logprobs is not None:
                choice["prompt_logprobs"] = vllm_prompt_logprobs(tok, out.prompt_logprobs)
            if body.return_token_ids:
                choice.update(token_ids=out.token_ids, prompt_token_ids=ids_list[i // body.n])
            choices.append(choice)
        return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
                "model": served.name, "choices": choices,
                "usage": server.count(served, outs, [len(ids) for ids in ids_list], body.n)}

    # -- chat ------------------------------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        served, arrival = server.model(body.model), arrival_of(request)
        max_tokens = body.max_completion_tokens or body.max_tokens
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        top = (body.top_logprobs or 0) if body.logprobs else None
        if body.stream and body.prompt_logprobs is not None:
            raise APIError(400, "prompt_logprobs are not streamed; send stream: false", param="stream")
        tools = plan(body, served, server.tool_parser)  # tools offered, how their calls are read and forced
        grammar = tools.grammar if tools is not None else None
        sampling_params(body, max_tokens or 1, top, body.n - 1, grammar)  # a bad parameter: 400 before rendering
        ids = await server.chat_ids(served, body.messages, body.chat_template_kwargs, max_tokens,
                                    tools=tools.tools if tools is not None else None)
        if max_tokens is None:  # as much as the context and the KV pool leave (OpenAI: no default cap)
            engine = served.engine.engine
            max_tokens = min(served.max_model_len, engine.num_blocks * engine.block_size) - len(ids)
        # the prompt's log-probabilities (vLLM's prompt_logprobs) are the same for every choice: the first asks
        params = [[sampling_params(body, max_tokens, top, i, grammar,
                                   prompt_logprobs=body.prompt_logprobs if i == 0 else None) for i in range(body.n)]]
        if body.stream:
            return sse_response(stream_choices(server, served, body, [ids], params, "chat.completion.chunk", arrival,
                                               tools=tools))
        outs = await server.generate(served, request, [ids], params, arrival)
        choices = []
        for i, out in enumerate(outs):
            message, reason = {"role": "assistant", "content": out.text}, finish_reason(out.finish_reason)
            if tools is not None and tools.parser is not None:
                text = output_text(served.llm.tokenizer, out, params[0][i].stop, tools.keep)
                content, calls = parse_output(tools.parser, text, tools.single, tools.grammar is not None)
                message["content"] = content
                if calls:
                    message["tool_calls"] = calls
                    reason = "tool_calls" if reason != "length" else reason
            choice = {"index": i, "message": message, "finish_reason": reason,
                      "logprobs": None if top is None else chat_logprobs(
                          served.llm.tokenizer, out.token_ids, out.logprobs, top, body.return_tokens_as_token_ids)}
            if body.return_token_ids:
                choice["token_ids"] = out.token_ids
            choices.append(choice)
        response = {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
                    "model": served.name, "choices": choices, "usage": server.count(served, outs, [len(ids)], body.n)}
        if body.return_token_ids:
            response["prompt_token_ids"] = ids
        if body.prompt_logprobs is not None:  # vLLM's place on chat: the response's, not a choice's
            response["prompt_logprobs"] = vllm_prompt_logprobs(served.llm.tokenizer, outs[0].prompt_logprobs)
        return response

    # -- sessions (ours): an agent's context kept in the KV cache between turns ---------------------------------
    def too_many_sessions():
        if len(server.sessions) >= server.max_sessions:
            raise APIError(429, f"{len(server.sessions)} sessions are open (limit {server.max_sessions}); close some",
                           type="rate_limit_exceeded", code="rate_limit_exceeded")

    @app.post("/v1/sessions")
    async def open_session(body: SessionOpen):
        served = server.model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give either prompt or messages", param="prompt")
        too_many_sessions()
        if body.messages is not None:
            ids = await server.chat_ids(served, body.messages, body.chat_template_kwargs)
        else:
            ids = await server.prompt_ids(served, body.prompt)
        too_many_sessions()  # others may have opened theirs while this prompt was tokenized
        session = await served.engine.open_session(ids, tag="session")
        session_id = new_id("sess")
        server.sessions[session_id] = (served, session)
        return {"id": session_id, "object": "session", "model": served.name, "num_tokens": session.num_tokens}

    @app.post("/v1/sessions/{session_id}/append")
    async def append(session_id: str, body: SessionAppend):
        served, session = server.session(session_id)
        if (body.text is None) == (body.token_ids is None):
            raise APIError(400, "give either text or token_ids", param="text")
        server.check_idle(session, session_id)
        ids = await server.append_ids(served, session, body.text, body.token_ids)
        served, session = server.session(session_id)  # closed while its text was tokenized: 404
        server.check_idle(session, session_id)
        try:
            added = await served.llm.extend(session, ids)
        except ValueError as error:
            raise APIError(400, str(error), param="text" if body.text is not None else "token_ids")
        return {"id": session_id, "object": "session", "num_tokens": session.num_tokens, "appended": added}

    @app.post("/v1/sessions/{session_id}/continue")
    async def continue_session(session_id: str, body: SessionContinue, request: Request):
        served, session = server.session(session_id)
        arrival = arrival_of(request)
        server.check_idle(session, session_id)
        max_tokens = body.max_tokens
        server.check_length(served, session.num_tokens, max_tokens, "max_tokens", where="session")
        if max_tokens is None:  # as much as the context and the KV pool leave
            engine = served.engine.engine
            max_tokens = min(served.max_model_len, engine.num_blocks * engine.block_size) - session.num_tokens
        params = sampling_params(body, max_tokens, body.logprobs)
        server.admit(served)
        served.in_flight += 1
        try:
            (out,) = await server.wait(request, [server.run_one(served, session, params, arrival, tag="turn")])
        except ValueError as error:
            raise APIError(400, str(error), param="max_tokens")
        except RuntimeError:
            if session.closed:
                raise APIError(409, f"session `{session_id}` was closed (DELETE) while this continue ran; "
                                    f"what it generated is gone with it", param="session_id",
                               code="session_closed") from None
            raise
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
