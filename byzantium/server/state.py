"""What the server holds and the request logic its routes share: the models served (Served), admission
(429 when a model's queue is full), context length checks, prompts and chat messages to token ids,
running non-streamed requests, and usage counts."""
from __future__ import annotations

import asyncio
import time

from ..engine.chat import ChatTemplateError, render_chat
from .metrics import Metrics
from .schemas import APIError

KEEP_STEP_RECORDS = 10_000  # a server runs for days: keep the latest step records only (totals count all)


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
    """What every route works on: the models served, the open sessions, the limits and the metrics."""

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

    def session(self, session_id):
        """(Served, Session) of an open session; 404 when it was closed or never opened."""
        if session_id not in self.sessions:
            raise APIError(404, f"no session `{session_id}` (closed, or never opened)", param="session_id",
                           code="session_not_found")
        return self.sessions[session_id]

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
