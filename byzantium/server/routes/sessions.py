"""Our /v1/sessions: an agent's context kept in the KV cache between turns (open, append, continue, close)."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request

from ..responses import completion_logprobs, finish_reason, new_id
from ..schemas import SessionAppend, SessionContinue, SessionOpen
from .deps import ServerDep, arrival_of

router = APIRouter()


@router.post("/v1/sessions")
async def open_session(body: SessionOpen, server: ServerDep) -> dict:
    served = server.model(body.model)
    session_id, session = await server.open_session(served, body.prompt, body.messages, body.chat_template_kwargs)
    return {"id": session_id, "object": "session", "model": served.name, "num_tokens": session.num_tokens}


@router.post("/v1/sessions/{session_id}/append")
async def append(session_id: str, body: SessionAppend, server: ServerDep) -> dict:
    session, added = await server.append_to_session(session_id, body.text, body.token_ids)
    return {"id": session_id, "object": "session", "num_tokens": session.num_tokens, "appended": added}


@router.post("/v1/sessions/{session_id}/continue")
async def continue_session(session_id: str, body: SessionContinue, request: Request, server: ServerDep) -> dict:
    served, session, out = await server.continue_session(session_id, body, request, arrival_of(request))
    choice = {"index": 0, "text": out.text, "finish_reason": finish_reason(out.finish_reason),
              "token_ids": out.token_ids,
              "logprobs": None if body.logprobs is None else completion_logprobs(
                  served.tokenizer, out.token_ids, out.logprobs, body.logprobs, body.return_tokens_as_token_ids)}
    return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
            "model": served.name, "session": {"id": session_id, "num_tokens": session.num_tokens},
            "choices": [choice], "usage": server.count(served, [out], [out.num_prompt_tokens], 1)}


@router.delete("/v1/sessions/{session_id}")
async def close_session(session_id: str, server: ServerDep) -> dict:
    await server.close_session(session_id)
    return {"id": session_id, "object": "session", "deleted": True}
