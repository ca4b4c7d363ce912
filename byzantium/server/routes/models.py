"""The models served (GET /v1/models, /v1/models/{id}) and vLLM's tokenizer routes (POST /tokenize,
/detokenize), which lm-eval's local-completions probes."""
from __future__ import annotations

from fastapi import APIRouter

from ..schemas import DetokenizeRequest, TokenizeRequest
from .deps import ServerDep

router = APIRouter()


@router.get("/v1/models")
async def list_models(server: ServerDep) -> dict:
    return {"object": "list", "data": [served.card() for served in server.models.values()]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, server: ServerDep) -> dict:
    return server.model(model_id).card()


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, server: ServerDep) -> dict:
    served = server.tokenizer_model(body.model)
    ids = await server.tokenize(served, body.prompt, body.add_special_tokens)
    return {"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, server: ServerDep) -> dict:
    served = server.tokenizer_model(body.model)
    return {"prompt": await server.detokenize(served, body.tokens)}
