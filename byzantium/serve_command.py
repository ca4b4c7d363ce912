"""`byzantium serve`: the server's flags and its run (server/app.py), as a Command the CLI imports only
when it serves (the server imports FastAPI and torch)."""
from .commands import Command
from .server import add_serve_args, cmd_serve

COMMAND = Command("serve", "an OpenAI-compatible HTTP server on the engine (/v1/completions, /v1/chat/completions, "
                           "/v1/sessions, /metrics)", add_serve_args, cmd_serve)
