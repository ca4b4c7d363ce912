"""What every handler takes: the Server of its app, and when its request arrived."""
from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import StreamingResponse

from ..guard import ARRIVAL
from ..state import Server


def server_of(request: Request) -> Server:
    return request.app.state.server


ServerDep = Annotated[Server, Depends(server_of)]


def arrival_of(request: Request) -> float:
    """When the request reached the server (the Guard's clock), for the latency metrics."""
    return request.scope.get(ARRIVAL) or time.perf_counter()


def sse_response(events) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream")
