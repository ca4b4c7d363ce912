"""The routes of the OpenAI-compatible server, one router a topic, each handler thin over the Server
(state.py: the models served, tokenizing, running and aborting requests, sessions):

    admin.py        GET /health, GET /metrics
    models.py       GET /v1/models, /v1/models/{id}; vLLM's POST /tokenize, /detokenize
    completions.py  POST /v1/completions
    chat.py         POST /v1/chat/completions
    sessions.py     our /v1/sessions: open, append, continue, close

`add_routes` puts them on an app with the error handlers that give every error OpenAI's shape and the
Guard middleware."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..guard import Guard
from ..schemas import APIError, error_response, validation_error_response
from ..state import Server
from . import admin, chat, completions, models, sessions

ROUTERS = (admin.router, models.router, completions.router, chat.router, sessions.router)


def add_routes(app: FastAPI, server: Server) -> None:
    """The routes of `server` on `app` (which keeps it as app.state.server, where handlers find it), with
    the error handlers and the Guard middleware."""
    app.state.server = server

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return error_response(error.status, error.message, error.type, error.param, error.code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        return validation_error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        return error_response(error.status_code, str(error.detail), code=None)

    @app.exception_handler(Exception)
    async def server_error(request: Request, error: Exception):  # a bug, or an engine failure: OpenAI's shape
        return error_response(500, f"the server failed on this request: {type(error).__name__}: {error}",
                              type="server_error")

    own = [route for route in app.router.routes if hasattr(route, "path")]  # FastAPI's own: /openapi.json
    app.add_middleware(Guard, server=server, routes=own + [route for router in ROUTERS for route in router.routes])
    for router in ROUTERS:
        app.include_router(router)
