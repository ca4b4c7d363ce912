"""POST /v1/completions: prompts (text or token ids, one or several) with n choices each, streamed or
not; echo, logprobs, and the prompt's log-probabilities (echo with logprobs, vLLM's prompt_logprobs)."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request

from ..responses import completion_logprobs, echo_logprobs, finish_reason, new_id, vllm_prompt_logprobs
from ..schemas import APIError, CompletionRequest, sampling_params
from ..streaming import stream_choices
from .deps import ServerDep, arrival_of, sse_response

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, server: ServerDep):
    served, arrival = server.model(body.model), arrival_of(request)
    asked = prompt_logprobs_asked(body)
    sampling_params(body, body.max_tokens, body.logprobs, body.n - 1, prompt_logprobs=asked)  # 400 before tokenizing
    ids_list = await server.completion_prompts(served, body)
    params = [[sampling_params(body, body.max_tokens, body.logprobs, i, prompt_logprobs=asked)
               for i in range(body.n)] for _ in ids_list]
    echo = await server.decode_each(served, ids_list) if body.echo else [""] * len(ids_list)
    if body.stream:
        return sse_response(stream_choices(server, served, body, ids_list, params, "text_completion", arrival, echo))
    outs = await server.generate(served, request, ids_list, params, arrival)
    return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
            "model": served.name,
            "choices": [choice(body, served.tokenizer, i, out, ids_list[i // body.n], echo[i // body.n])
                        for i, out in enumerate(outs)],
            "usage": server.count(served, outs, [len(ids) for ids in ids_list], body.n)}


def prompt_logprobs_asked(body: CompletionRequest) -> int | None:
    """The top k each prompt token's log-probability comes with, or None; a 400 for what cannot be served.
    They are computed in the batched prefill, the prefix cache capped there (engine/prompt_logprobs.py)."""
    asked = body.prompt_logprobs_asked()
    if body.stream and asked is not None:
        raise APIError(400, "prompt log-probabilities (echo with logprobs, prompt_logprobs, max_tokens 0) "
                            "are not streamed; send stream: false", param="stream")
    if body.max_tokens == 0 and not body.echo and body.prompt_logprobs is None:
        raise APIError(400, "max_tokens 0 needs echo or prompt_logprobs (nothing would be returned)",
                       param="max_tokens")
    return asked


def choice(body: CompletionRequest, tokenizer, index: int, out, prompt_ids: list[int], echo: str) -> dict:
    """Choice `index` of a completion: its text (after the echoed prompt), logprobs, and what vLLM adds."""
    as_ids = body.return_tokens_as_token_ids
    result = {"index": index, "text": echo + out.text, "finish_reason": finish_reason(out.finish_reason),
              "logprobs": None if body.logprobs is None else completion_logprobs(
                  tokenizer, out.token_ids, out.logprobs, body.logprobs, as_ids)}
    if body.echo and body.logprobs is not None:  # the prompt's tokens first, then the generated ones
        head, offset = echo_logprobs(tokenizer, prompt_ids, out.prompt_logprobs, as_ids)
        tail = completion_logprobs(tokenizer, out.token_ids, out.logprobs, body.logprobs, as_ids, offset)
        result["logprobs"] = {key: head[key] + tail[key] for key in head}
    if body.prompt_logprobs is not None:
        result["prompt_logprobs"] = vllm_prompt_logprobs(tokenizer, out.prompt_logprobs)
    if body.return_token_ids:
        result.update(token_ids=out.token_ids, prompt_token_ids=prompt_ids)
    return result
