"""The server's routers (byzantium/server/routes/): every endpoint of the API is on one of them, once, and
their handlers work through the Server (state.py), never reaching into a model's engine."""
import inspect

import pytest

pytest.importorskip("fastapi")

ENDPOINTS = {("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/models"), ("GET", "/v1/models/{model_id:path}"),
             ("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/v1/completions"),
             ("POST", "/v1/chat/completions"), ("POST", "/v1/sessions"), ("POST", "/v1/sessions/{session_id}/append"),
             ("POST", "/v1/sessions/{session_id}/continue"), ("DELETE", "/v1/sessions/{session_id}")}


def test_every_endpoint_is_on_one_router_once():
    from byzantium.server.routes import ROUTERS
    served = [(method, route.path) for router in ROUTERS for route in router.routes for method in route.methods]
    assert sorted(served) == sorted(ENDPOINTS)


def test_handlers_reach_no_engine():
    from byzantium.server import routes
    for module in (routes.admin, routes.models, routes.completions, routes.chat, routes.sessions):
        source = inspect.getsource(module)
        assert ".engine" not in source and ".llm" not in source, module.__name__
