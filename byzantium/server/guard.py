"""The server's ASGI middleware, around every HTTP request before FastAPI parses anything: its arrival time
(for the latency metrics), its count by route and status (byzantium:http_requests_total, refusals and
failures included), 503 once a shutdown began, the API key on /v1 routes (401), and the body size limit
(413: from Content-Length, or while a chunked body is read; never after reading a body past the limit)."""
from __future__ import annotations

import asyncio
import secrets
import time

from starlette.routing import Match

from .schemas import error_response

ARRIVAL = "byzantium.arrival"  # the scope key of the request's arrival time (time.perf_counter())


def route_of(scope, routes):
    """The route template the request matches (`/v1/sessions/{session_id}/continue`), so that the counter's
    labels stay few; `unmatched` for paths no route has."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return route.path
        if match is Match.PARTIAL and partial is None:  # the path with another method: 405
            partial = route.path
    return partial or "unmatched"


class Guard:
    """routes: the app's routes (those of its routers), whose templates label the request counter."""

    def __init__(self, app, server, routes=()):
        self.app, self.server, self.routes = app, server, list(routes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope[ARRIVAL] = time.perf_counter()
        route, status = route_of(scope, self.routes), None

        async def counted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, counted)
        except asyncio.CancelledError:
            status = status or 499  # cancelled before answering: the client went away, or a forced shutdown
            raise
        except Exception:
            status = status or 500  # answered by the server error handler, outside this middleware
            raise
        finally:
            self.server.metrics.http_request(route, status or 499)

    async def _guarded(self, scope, receive, send):
        server, headers = self.server, dict(scope["headers"])
        if server.stopping:
            return await error_response(503, "the server is shutting down", type="server_error",
                                        code="server_shutting_down")(scope, receive, send)
        if server.api_key is not None and scope["path"].startswith("/v1"):
            given = headers.get(b"authorization", b"")
            if not secrets.compare_digest(given, f"Bearer {server.api_key}".encode()):
                return await error_response(401, "Incorrect or missing API key: send `Authorization: Bearer KEY`",
                                            code="invalid_api_key")(scope, receive, send)
        limit = server.max_body_bytes
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await self._too_large(int(length), scope, receive, send)
        if length is None and scope["method"] in ("POST", "PUT", "PATCH"):  # chunked: judged while read
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

            async def receive():  # the app reads the body we already read, then whatever follows
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
