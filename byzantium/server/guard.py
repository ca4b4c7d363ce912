"""The server's ASGI middleware: the API key on /v1 routes (401), and the body size limit (413), both
judged before FastAPI parses anything."""
from __future__ import annotations

import secrets

from .schemas import error_response


class Guard:
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
