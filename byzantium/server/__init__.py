"""An OpenAI-compatible HTTP server on the engine: `byzantium serve`.

    app = build_app({"smollm2-135m": llm})          # name -> NativeLLM; one AsyncEngine per model
    with ServerThread(app) as url: ...              # uvicorn in a thread, on a free port (tests, embedding)

Every request of every client becomes a request of its model's AsyncEngine, so concurrent clients share
forward passes and the prefix cache. Endpoints: GET /health, GET /metrics (Prometheus, vLLM's names
under `byzantium:`), GET /v1/models and /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions (both with stream, n, logprobs, usage with cached tokens),
and our own /v1/sessions (open, append, continue, close), which keep an agent's context in the KV cache
between turns so that round-robin over HTTP prefills only the new tokens.

The package's names (build_app, ServerThread, ...) are imported on first use (PEP 562), not with the
package, so that `byzantium serve --help` reads args.py without FastAPI, uvicorn or torch.

The files, each importing only those below it:
    app.py        build_app, ServerThread, serve and the `byzantium serve` command's run
    args.py       the `byzantium serve` command's flags (light: no FastAPI, uvicorn or torch)
    routes/       one FastAPI router a topic (admin, models, completions, chat, sessions), thin handlers
                  over the Server; the error handlers
    streaming.py  streamed choices as server-sent events
    guard.py      the middleware: arrival time, request counts, 503 while stopping, API key, body size
    state.py      the Server the handlers work through: the models served, admission, prompts (tokenized
                  off the event loop), running and aborting requests, sessions, usage, the shutdown timeout
    metrics.py    the Prometheus metrics and each engine request's timing
    responses.py  ids, finish reasons, logprobs, text deltas, events
    schemas.py    request bodies, their sampling params, the error shape
"""
from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports

if TYPE_CHECKING:  # what editors and type checkers see; at run time the names load on first use
    from .app import ServerThread, build_app, cmd_serve, serve
    from .args import add_serve_args
    from .schemas import APIError

# name -> the module that defines it
_PUBLIC = {"APIError": ".schemas", "ServerThread": ".app", "add_serve_args": ".args", "build_app": ".app",
           "cmd_serve": ".app", "serve": ".app"}

__all__ = ["APIError", "ServerThread", "add_serve_args", "build_app", "cmd_serve", "serve"]


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
