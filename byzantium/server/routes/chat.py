"""POST /v1/chat/completions: a chat rendered by the model's template, n choices, streamed or not;
logprobs, the prompt's log-probabilities (vLLM's prompt_logprobs), and tools (server/tools.py)."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request

from ..responses import chat_logprobs, finish_reason, new_id, output_text, vllm_prompt_logprobs
from ..schemas import APIError, ChatRequest, sampling_params
from ..streaming import stream_choices
from ..tool_parsers import parse_output
from ..tools import ToolPlan, plan
from .deps import ServerDep, arrival_of, sse_response

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(body: ChatRequest, request: Request, server: ServerDep):
    served, arrival = server.model(body.model), arrival_of(request)
    max_tokens = body.max_completion_tokens or body.max_tokens
    top = top_logprobs(body)
    tools = plan(body, served, server.tool_parser)  # tools offered, how their calls are read and forced
    grammar = tools.grammar if tools is not None else None
    sampling_params(body, max_tokens or 1, top, body.n - 1, grammar)  # a bad parameter: 400 before rendering
    ids = await server.chat_ids(served, body.messages, body.chat_template_kwargs, max_tokens,
                                tools=tools.tools if tools is not None else None)
    if max_tokens is None:  # as much as the context and the KV pool leave (OpenAI: no default cap)
        max_tokens = served.room(len(ids))
    # the prompt's log-probabilities (vLLM's prompt_logprobs) are the same for every choice: the first asks
    params = [[sampling_params(body, max_tokens, top, i, grammar,
                               prompt_logprobs=body.prompt_logprobs if i == 0 else None) for i in range(body.n)]]
    if body.stream:
        return sse_response(stream_choices(server, served, body, [ids], params, "chat.completion.chunk", arrival,
                                           tools=tools))
    outs = await server.generate(served, request, [ids], params, arrival)
    response = {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
                "model": served.name,
                "choices": [choice(body, served.tokenizer, i, out, params[0][i].stop, tools, top)
                            for i, out in enumerate(outs)],
                "usage": server.count(served, outs, [len(ids)], body.n)}
    if body.return_token_ids:
        response["prompt_token_ids"] = ids
    if body.prompt_logprobs is not None:  # vLLM's place on chat: the response's, not a choice's
        response["prompt_logprobs"] = vllm_prompt_logprobs(served.tokenizer, outs[0].prompt_logprobs)
    return response


def top_logprobs(body: ChatRequest) -> int | None:
    """How many top log-probabilities each generated token comes with, or None for no logprobs; a 400 for
    what cannot be served."""
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    if body.stream and body.prompt_logprobs is not None:
        raise APIError(400, "prompt_logprobs are not streamed; send stream: false", param="stream")
    return (body.top_logprobs or 0) if body.logprobs else None


def choice(body: ChatRequest, tokenizer, index: int, out, stops: list[str], tools: ToolPlan | None,
           top: int | None) -> dict:
    """Choice `index` of a chat: its message (tool calls parsed out of it when tools were offered)."""
    message, reason = {"role": "assistant", "content": out.text}, finish_reason(out.finish_reason)
    if tools is not None and tools.parser is not None:
        text = output_text(tokenizer, out, stops, tools.keep)
        content, calls = parse_output(tools.parser, text, tools.single, tools.grammar is not None)
        message["content"] = content
        if calls:
            message["tool_calls"] = calls
            reason = "tool_calls" if reason != "length" else reason
    result = {"index": index, "message": message, "finish_reason": reason,
              "logprobs": None if top is None else chat_logprobs(
                  tokenizer, out.token_ids, out.logprobs, top, body.return_tokens_as_token_ids)}
    if body.return_token_ids:
        result["token_ids"] = out.token_ids
    return result
