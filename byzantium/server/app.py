"""Building the server's app, running it (ServerThread: uvicorn in a thread; serve: until interrupted),
and the `byzantium serve` command's run (its flags are in args.py, which loads none of this).

Shutting down (Ctrl+C, SIGTERM, ServerThread's exit): the listening socket closes and new requests get
503; requests in flight have the shutdown timeout to end, then each gets a 503 `server_shutting_down`
(a stream: that error as its last event, then [DONE]) and is aborted; then the process exits."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from ..backends import LLMPool, check_model, split_kwargs
from ..engine.config import resolve_device
from ..engine.memory import DEFAULT_CPU_KV_GIB
from .args import add_serve_args  # noqa: F401  (the flags cmd_serve reads, importable from here as before)
from .routes import add_routes
from .state import Server


def build_app(llms, api_key=None, max_waiting=512, max_body_bytes=8 << 20, max_sessions=1024,
              shutdown_timeout=30.0, tool_parser=None) -> FastAPI:
    """The app for {served name: NativeLLM}; api_key set: every /v1 route wants `Authorization: Bearer KEY`;
    shutdown_timeout: seconds requests in flight get to end once a shutdown begins; tool_parser: the tool
    call format of every model (hermes, llama3_json, mistral; default: each model's chat template's)."""
    server = Server(llms, api_key, max_waiting, max_body_bytes, max_sessions, shutdown_timeout, tool_parser)
    app = FastAPI(title="Byzantium", docs_url=None, redoc_url=None)
    add_routes(app, server)
    return app


GRACE_S = 5  # uvicorn cancels what is left this long after the shutdown timeout (the requests have ended by then)


class Uvicorn(uvicorn.Server):
    """uvicorn that tells the app when a shutdown begins, so that requests in flight get the app's shutdown
    timeout and then a 503 (uvicorn's own graceful timeout, a few seconds later, is the backstop). Another
    app (no byzantium Server in its state: a stand-in server in tests) is served as uvicorn serves it."""

    def __init__(self, app, **config):
        self.app_server = getattr(app.state, "server", None)
        graceful = None if self.app_server is None else self.app_server.shutdown_timeout + GRACE_S
        super().__init__(uvicorn.Config(app, timeout_graceful_shutdown=graceful, **config))

    async def shutdown(self, sockets=None):
        if self.app_server is not None:
            self.app_server.begin_shutdown()
        await super().shutdown(sockets)
        if self.app_server is not None:
            await self.app_server.drain(GRACE_S)



class ServerThread:
    """uvicorn serving `app` in a background thread (port 0: a free port); the context gives its base URL.
    shutdown_timeout (default: the app's) bounds how long requests in flight may keep the exit waiting."""

    def __init__(self, app, host="127.0.0.1", port=0, log_level="warning", shutdown_timeout=None):
        app_server = getattr(app.state, "server", None)
        if shutdown_timeout is not None and app_server is not None:
            app_server.shutdown_timeout = shutdown_timeout
        self.server = Uvicorn(app, host=host, port=port, log_level=log_level)
        self.thread = threading.Thread(target=self.server.run, name="byzantium-server", daemon=True)
        self.host = host
        self.join_s = (30 if app_server is None else app_server.shutdown_timeout) + GRACE_S + 5

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=self.join_s)


def cmd_serve(args):
    """`byzantium serve`: check the flags and the model names, then load each model once and serve."""
    models = args.model or ["smollm2-135m"]
    if len(set(models)) != len(models):
        raise ValueError(f"--model names a model twice: {', '.join(models)}")
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    for flag in ("max_num_seqs", "max_waiting", "max_sessions"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.max_body_mb <= 0:
        raise ValueError(f"--max-body-mb must be > 0, got {args.max_body_mb}")
    if not args.shutdown_timeout >= 0:
        raise ValueError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    chat_template = read_chat_template(args.chat_template) if getattr(args, "chat_template", None) else None
    split = split_kwargs(args)
    for name in models:
        check_model(name)
    if args.num_speculative_tokens is not None and args.num_speculative_tokens < 0:
        raise ValueError(f"--num-speculative-tokens must be >= 0, got {args.num_speculative_tokens}")
    engine = {k: v for k, v in (("device", args.device), ("dtype", args.dtype),
                                ("num_speculative_tokens", args.num_speculative_tokens)) if v is not None}
    engine.update(split)
    if "kv_cache_gib" not in engine and resolve_device(args.device).type == "cpu":
        engine["kv_cache_gib"] = DEFAULT_CPU_KV_GIB  # given, so reserved at start: resident memory stays flat
    serve(models, args.host, args.port, args.api_key, args.max_waiting, int(args.max_body_mb * (1 << 20)),
          args.max_sessions, args.shutdown_timeout, getattr(args, "tool_call_parser", None),
          max_num_seqs=args.max_num_seqs, chat_template=chat_template, **engine)


def kv_cache_line(name, llm):
    """What a model's KV cache holds, said at start: its size and the tokens it has room for."""
    engine = llm.engine.engine
    size = engine.kv_cache.numel() * engine.kv_cache.element_size()
    how = "reserved" if engine.engine_config.kv_cache_gib is not None or engine.device.type != "cpu" else "at most"
    return (f"{name}: KV cache {size / 2**30:.2f} GiB {how} on {engine.device}, room for "
            f"{engine.num_blocks * engine.block_size:,} tokens ({engine.num_blocks} blocks of {engine.block_size})")


def read_chat_template(path):
    """The text of a --chat-template file; a clear error when it cannot be read or is empty."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"--chat-template {path}: cannot read it ({error.strerror or error})") from None
    if not text.strip():
        raise ValueError(f"--chat-template {path}: the file is empty")
    return text


def serve(models, host="127.0.0.1", port=8000, api_key=None, max_waiting=512, max_body_bytes=8 << 20,
          max_sessions=1024, shutdown_timeout=30.0, tool_parser=None, chat_template=None, **engine_kwargs):
    """Load each model (served under the name given) and serve them until interrupted; then requests in
    flight get shutdown_timeout seconds, the engines close and this returns. chat_template: a template's
    text that replaces each model's own."""
    with LLMPool("native", **engine_kwargs) as pool:
        llms = {name: pool.get(name) for name in models}
        for name, llm in llms.items():
            if chat_template is not None and llm.tokenizer is not None:
                llm.tokenizer.chat_template = chat_template
            print(kv_cache_line(name, llm), flush=True)
        print(f"serving {', '.join(llms)} on http://{host}:{port}/v1", flush=True)
        app = build_app(llms, api_key, max_waiting, max_body_bytes, max_sessions, shutdown_timeout, tool_parser)
        Uvicorn(app, host=host, port=port, log_level="info").run()

