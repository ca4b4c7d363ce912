"""The `byzantium serve` command's flags. Kept apart from the app (app.py: FastAPI, uvicorn, torch) so that
`byzantium serve --help` and a misspelled flag are answered without loading the server; this imports only
light modules (the shared model-split flags, the tool call parsers' names)."""
from ..backends import add_model_split_args
from .tool_parsers import PARSERS


def add_serve_args(ap):
    ap.add_argument("--model", action="append", default=None,
                    help="a model to serve, under this name (repeat for several; default smollm2-135m)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    ap.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1 routes")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    ap.add_argument("--max-num-seqs", type=int, default=256, help="sequences one engine step may batch (default 256)")
    ap.add_argument("--num-speculative-tokens", type=int, default=None, metavar="K",
                    help="prompt-lookup draft tokens a request may take a step (default 4 on CPU, 0 = off on CUDA)")
    add_model_split_args(ap)
    ap.add_argument("--max-waiting", type=int, default=512,
                    help="requests a model may have waiting for a place in the batch; more get 429 (default 512)")
    ap.add_argument("--max-body-mb", type=float, default=8, help="largest request body in MiB; larger get 413 (default 8)")
    ap.add_argument("--max-sessions", type=int, default=1024, help="open /v1/sessions at most (default 1024)")
    ap.add_argument("--shutdown-timeout", type=float, default=30, metavar="S",
                    help="on shutdown, seconds requests in flight get to end before each gets a 503 "
                         "(server_shutting_down) and the process exits (default 30)")
    ap.add_argument("--tool-call-parser", choices=sorted(PARSERS), default=None,
                    help="the format tool calls are read in, for every model (default: the one each model's "
                         "chat template uses: <tool_call> hermes, [TOOL_CALLS] mistral, <|python_tag|> llama3_json)")
    ap.add_argument("--chat-template", default=None, metavar="PATH",
                    help="a Jinja chat template file that replaces every served model's own (e.g. one with a tool "
                         "format); default: each model's own, and for the embedded model, with tools, the shipped "
                         "Hermes-style one")
