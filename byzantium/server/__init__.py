"""An OpenAI-compatible HTTP server on the engine: `byzantium serve`.

    app = build_app({"smollm2-135m": llm})          # name -> NativeLLM; one AsyncEngine per model (app.py)
    with ServerThread(app) as url: ...              # uvicorn in a thread, on a free port (tests, embedding)

Every request of every client becomes a request of its model's AsyncEngine, so concurrent clients share
forward passes and the prefix cache. Endpoints (routes.py): GET /health, GET /metrics (Prometheus,
metrics.py), GET /v1/models, POST /v1/completions, POST /v1/chat/completions (both with stream, n, logprobs,
usage with cached tokens), and our own /v1/sessions (open, append, continue, close), which keep an agent's
context in the KV cache between turns so that round-robin over HTTP prefills only the new tokens.
Request bodies, their extensions and the error shape: schemas.py. Imports point one way:
app -> routes -> schemas, app -> metrics.
"""
from .app import add_serve_args, cmd_serve

__all__ = ["add_serve_args", "cmd_serve"]
