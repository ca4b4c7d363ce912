"""The server's app: its state (the models served, admission, prompts, running requests), build_app,
ServerThread (uvicorn in a thread) and the `byzantium serve` command."""
from __future__ import annotations

import asyncio
import threading
import time

from fastapi import FastAPI

from ..backends.params import SamplingParams
from ..engine.chat import ChatTemplateError, render_chat
from .metrics import Metrics
from .routes import add_routes
from .schemas import APIError

KEEP_STEP_RECORDS = 10_000  # a server runs for days: keep the latest step records only (totals count all)


# -- the server ---------------------------------------------------------------------------------------------
class Served:
    """One model behind the server: its LLM (a NativeLLM), its AsyncEngine and its counters."""

    def __init__(self, name, llm):
        self.name, self.llm, self.engine = name, llm, llm.engine
        self.engine.engine.step_records.keep_records = KEEP_STEP_RECORDS
        self.created = int(time.time())
        self.in_flight = 0  # engine requests this server admitted and that have not ended

    @property
    def waiting(self):
        """Requests not in the running batch: admitted here but not yet running, or queued in the engine."""
        return max(self.in_flight - self.engine.num_running, self.engine.num_waiting)

    @property
    def max_model_len(self):
        return self.engine.engine.max_model_len


class Server:
    def __init__(self, llms, api_key=None, max_waiting=512, max_body_bytes=8 << 20, max_sessions=1024):
        if not llms:
            raise ValueError("a server needs at least one model")
        self.models = {name: Served(name, llm) for name, llm in llms.items()}
        self.api_key, self.max_waiting, self.max_body_bytes = api_key, max_waiting, max_body_bytes
        self.max_sessions = max_sessions
        self.sessions = {}  # id -> (Served, Session)
        self.metrics = Metrics(self)

    # -- checks ----------------------------------------------------------------------------------------
    def model(self, name) -> Served:
        if name not in self.models:
            raise APIError(404, f"The model `{name}` does not exist. Served: {', '.join(self.models)}",
                           param="model", code="model_not_found")
        return self.models[name]

    def admit(self, served, count=1):
        """429 when the model's waiting queue is full (the engine stays bounded, the others keep going)."""
        if served.waiting + count > self.max_waiting:
            raise APIError(429, f"the server is busy: {served.waiting} requests are waiting for "
                                f"`{served.name}` (limit {self.max_waiting}); retry later",
                           type="rate_limit_exceeded", code="rate_limit_exceeded")

    @staticmethod
    def check_length(served, ids, max_tokens, param):
        limit = served.max_model_len
        if len(ids) >= limit or (max_tokens is not None and len(ids) + max_tokens > limit):
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{len(ids) + (max_tokens or 0)} tokens ({len(ids)} in the {param}, "
                                f"{max_tokens or 0} for the completion). Please reduce the length.",
                           param=param, code="context_length_exceeded")

    # -- prompts ---------------------------------------------------------------------------------------
    def completion_prompts(self, served, body):
        prompt = body.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise APIError(400, "prompt is empty", param="prompt")
        out = []
        for p in prompt:
            try:
                out.append(served.engine.engine.encode(p))
            except ValueError as error:
                raise APIError(400, str(error), param="prompt")
        return out

    def chat_ids(self, served, messages, template_kwargs, param="messages"):
        conversation = []
        for i, m in enumerate(messages):
            content = m.content
            if isinstance(content, list):  # content parts: only text ones can be served here
                if any(part.get("type") != "text" for part in content):
                    raise APIError(400, "only text content parts are supported", param=f"messages[{i}].content")
                content = "".join(part.get("text", "") for part in content)
            message = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
            if m.untrusted is not None:
                message["untrusted"] = m.untrusted
            conversation.append(message)
        if served.llm.tokenizer is None:
            raise APIError(400, f"model `{served.name}` has no tokenizer, so no chat template", param="model")
        try:
            return render_chat(served.llm.tokenizer, conversation, **(template_kwargs or {}))
        except (ChatTemplateError, TypeError, ValueError) as error:
            raise APIError(400, f"the chat template cannot render these messages: {error}", param=param)
        except Exception as error:  # jinja2 errors raised by the template itself (e.g. "roles must alternate")
            raise APIError(400, f"the chat template refused these messages: {error}", param=param)

    @staticmethod
    def params(body, max_tokens, logprobs, index=0):
        """SamplingParams of choice `index`: with a seed, choice i samples with seed + i (distinct choices)."""
        try:
            return SamplingParams(
                max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                seed=None if body.seed is None else body.seed + index, stop=body.stop,
                stop_token_ids=body.stop_token_ids or [], ignore_eos=body.ignore_eos, logprobs=logprobs,
                presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty)
        except ValueError as error:
            field = next((f for f in ("max_tokens", "temperature", "top_p", "top_k", "logprobs", "stop",
                                      "presence_penalty", "frequency_penalty") if f in str(error)), None)
            raise APIError(400, str(error), param=field)

    # -- running requests ----------------------------------------------------------------------------
    async def generate(self, served, request, ids_list, param_lists):
        """Non-streamed: every (prompt, choice) as one engine request; a client gone cancels them."""
        prompts = [ids for ids, params in zip(ids_list, param_lists) for _ in params]
        params = [p for params in param_lists for p in params]
        self.admit(served, len(prompts))
        served.in_flight += len(prompts)
        try:
            task = asyncio.ensure_future(served.engine.generate(prompts, params, tag="serve"))
            while not task.done():
                await asyncio.wait([task], timeout=0.5)
                if not task.done() and await request.is_disconnected():
                    task.cancel()  # AsyncEngine aborts the requests and frees their blocks
            return task.result()
        except asyncio.CancelledError:
            raise APIError(499, "the client closed the connection", code="client_closed")
        except ValueError as error:
            raise APIError(400, str(error), param="max_tokens" if "max_tokens" in str(error) else None)
        finally:
            served.in_flight -= len(prompts)

    def count(self, served, outs, prompt_lens, n):
        """usage: prompt tokens once per prompt; cached tokens as the first choice of each prompt found them."""
        cached = sum(outs[i * n].num_cached_tokens for i in range(len(prompt_lens)))
        generated = sum(len(o.token_ids) for o in outs)
        self.metrics.tokens(served.name, sum(prompt_lens), cached, generated)
        return {"prompt_tokens": sum(prompt_lens), "completion_tokens": generated,
                "total_tokens": sum(prompt_lens) + generated, "prompt_tokens_details": {"cached_tokens": cached}}



def build_app(llms, api_key=None, max_waiting=512, max_body_bytes=8 << 20, max_sessions=1024) -> FastAPI:
    """The app for {served name: NativeLLM}; api_key set: every /v1 route wants `Authorization: Bearer KEY`."""
    server = Server(llms, api_key, max_waiting, max_body_bytes, max_sessions)
    app = FastAPI(title="Byzantium", docs_url=None, redoc_url=None)
    app.state.server = server
    add_routes(app, server)
    return app


class ServerThread:
    """uvicorn serving `app` in a background thread (port 0: a free port); the context gives its base URL."""

    def __init__(self, app, host="127.0.0.1", port=0, log_level="warning"):
        import uvicorn
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                                    timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, name="byzantium-server", daemon=True)
        self.host = host

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
        self.thread.join(timeout=10)


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
    ap.add_argument("--max-waiting", type=int, default=512,
                    help="requests a model may have waiting for a place in the batch; more get 429 (default 512)")
    ap.add_argument("--max-body-mb", type=float, default=8, help="largest request body in MiB; larger get 413 (default 8)")
    ap.add_argument("--max-sessions", type=int, default=1024, help="open /v1/sessions at most (default 1024)")


def cmd_serve(args):
    """`byzantium serve`: check the flags and the model names, then load each model once and serve."""
    from .backends import check_model
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
    for name in models:
        check_model(name)
    if args.num_speculative_tokens is not None and args.num_speculative_tokens < 0:
        raise ValueError(f"--num-speculative-tokens must be >= 0, got {args.num_speculative_tokens}")
    engine = {k: v for k, v in (("device", args.device), ("dtype", args.dtype),
                                ("num_speculative_tokens", args.num_speculative_tokens)) if v is not None}
    serve(models, args.host, args.port, args.api_key, args.max_waiting, int(args.max_body_mb * (1 << 20)),
          args.max_sessions, max_num_seqs=args.max_num_seqs, **engine)


def serve(models, host="127.0.0.1", port=8000, api_key=None, max_waiting=512, max_body_bytes=8 << 20,
          max_sessions=1024, **engine_kwargs):
    """Load each model (served under the name given) and serve them until interrupted."""
    import uvicorn
    from .backends import LLMPool
    with LLMPool("native", **engine_kwargs) as pool:
        llms = {name: pool.get(name) for name in models}
        print(f"serving {', '.join(llms)} on http://{host}:{port}/v1", flush=True)
        uvicorn.run(build_app(llms, api_key, max_waiting, max_body_bytes, max_sessions), host=host, port=port,
                    log_level="info")

