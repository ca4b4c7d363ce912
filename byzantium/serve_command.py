"""`byzantium serve`: the server's flags (server/args.py, light) and its run (server/app.py, which imports
FastAPI, uvicorn and torch only once the flags have parsed), as a Command the CLI imports when it serves."""
from .commands import Command
from .server.args import add_serve_args


def cmd_serve(args):
    from .server.app import cmd_serve as serve  # the server's heavy imports, only to serve
    return serve(args)


COMMAND = Command("serve", "an OpenAI-compatible HTTP server on the engine (/v1/completions, /v1/chat/completions, "
                           "/v1/sessions, /metrics)", add_serve_args, cmd_serve)
