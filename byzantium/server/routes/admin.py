"""GET /health and GET /metrics (Prometheus)."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from .deps import ServerDep

router = APIRouter()


@router.get("/health")
async def health() -> dict:
    return {"status": "ok"}


@router.get("/metrics")
async def metrics(server: ServerDep) -> Response:
    body, content_type = server.metrics.render()
    return Response(body, media_type=content_type)
