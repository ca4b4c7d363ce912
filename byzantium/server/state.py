"""The Server: what the routes' handlers work through, so that none reaches into an engine. It holds the
models served (Served) and offers what a handler needs: the model a request names, admission (429 when a
model's queue is full), context length checks, prompts and chat messages to token ids (on a worker
thread, never on the event loop), /tokenize and /detokenize, running requests (observed for the
metrics, aborted when the client goes away or the shutdown timeout runs out), sessions, and usage counts."""
from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import TYPE_CHECKING

from ..engine.chat import ChatTemplateError, render_chat
from ..engine.sequence import Status
from .metrics import Metrics
from .responses import new_id
from .schemas import ROLES, APIError, sampling_params
from .tool_parsers import PARSERS
from .tools import default_tools_template, template_fields, tools_template_kwargs

if TYPE_CHECKING:
    from starlette.requests import Request

    from ..engine.sequence import Session
    from .schemas import Message, SessionContinue

KEEP_STEP_RECORDS = 10_000  # a server runs for days: keep the latest step records only (totals count all)
MAX_MESSAGES = 2048  # messages of one chat: rendering this many tiny ones takes a fraction of a second
TOKEN_CHARS_FALLBACK = 64  # characters a token may cover, for a tokenizer whose vocabulary cannot be read

# One worker thread per tokenizer: tokenizing and chat-template rendering leave the event loop, and the
# calls on one tokenizer never overlap (HF fast tokenizers are not safe for concurrent calls on one
# instance). Keyed by the tokenizer object (kept here, so its id is never reused); None: models that have
# no tokenizer (token-id prompts, checked on the worker too).
_WORKERS: dict[int, tuple[object, ThreadPoolExecutor]] = {}
_WORKERS_LOCK = threading.Lock()


def tokenizer_worker(tokenizer) -> ThreadPoolExecutor:
    with _WORKERS_LOCK:
        entry = _WORKERS.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            entry = _WORKERS[id(tokenizer)] = (tokenizer, ThreadPoolExecutor(1, thread_name_prefix="byzantium-tokenize"))
        return entry[1]


def longest_token(tokenizer) -> int:
    """Characters of the vocabulary's longest token: no token covers more characters of text (byte-level
    BPE spells a token one character a byte; SentencePiece one character a character, "<0x..>" for a
    byte), so a text of C characters has at least C / this many tokens."""
    try:
        return max(map(len, tokenizer.get_vocab()), default=1) or 1
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: a generous constant
        return TOKEN_CHARS_FALLBACK


class Served:
    """One model behind the server: its LLM (a NativeLLM), its AsyncEngine and its counters."""

    def __init__(self, name, llm):
        self.name, self.llm, self.engine = name, llm, llm.engine
        self.engine.engine.step_records.keep_records = KEEP_STEP_RECORDS
        self.created = int(time.time())
        self.in_flight = 0  # engine requests this server admitted and that have not ended
        tokenizer = llm.tokenizer
        self.worker = tokenizer_worker(tokenizer)
        self.token_chars = longest_token(tokenizer) if tokenizer is not None else TOKEN_CHARS_FALLBACK
        self.tools_template = default_tools_template(llm)  # for chats with tools, if its own has no tool format

    @property
    def waiting(self):
        """Requests not in the running batch: admitted here but not yet running, or queued in the engine."""
        return max(self.in_flight - self.engine.num_running, self.engine.num_waiting)

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len

    @property
    def tokenizer(self):
        """The model's Hugging Face tokenizer, or None (a model served on token ids only)."""
        return self.llm.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.engine.engine.config.vocab_size

    def room(self, num_tokens: int) -> int:
        """Tokens a request of `num_tokens` may generate at most: what the context and the KV pool leave
        (OpenAI's chats have no default cap)."""
        engine = self.engine.engine
        return min(self.max_model_len, engine.num_blocks * engine.block_size) - num_tokens

    async def on_worker(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) on this model's tokenizer thread."""
        return await asyncio.get_running_loop().run_in_executor(self.worker, functools.partial(fn, *args, **kwargs))

    def card(self):
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "byzantium",
                "max_model_len": self.max_model_len}


class Server:
    """What every route works through: the models served, the open sessions, the limits and the metrics."""

    def __init__(self, llms, api_key=None, max_waiting=512, max_body_bytes=8 << 20, max_sessions=1024,
                 shutdown_timeout=30.0, tool_parser=None):
        if not llms:
            raise ValueError("a server needs at least one model")
        if tool_parser is not None and tool_parser not in PARSERS:
            raise ValueError(f"unknown tool call parser {tool_parser!r}; one of {', '.join(PARSERS)}")
        self.tool_parser = tool_parser  # None: each model's from its chat template (server/tools.py)
        self.models = {name: Served(name, llm) for name, llm in llms.items()}
        self.api_key, self.max_waiting, self.max_body_bytes = api_key, max_waiting, max_body_bytes
        self.max_sessions, self.shutdown_timeout = max_sessions, shutdown_timeout
        self.sessions = {}  # id -> (Served, Session)
        self.metrics = Metrics(self)
        self.stopping = False  # a shutdown began: new requests get 503
        self._expired = None  # a future of the loop, done when the shutdown timeout ran out
        self._on_expiry = set()  # callbacks of the streams in flight

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
    def check_length(served, num_tokens, max_tokens, param, where="prompt"):
        limit = served.max_model_len
        if num_tokens >= limit or (max_tokens is not None and num_tokens + max_tokens > limit):
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{num_tokens + (max_tokens or 0)} tokens ({num_tokens} in the {where}, "
                                f"{max_tokens or 0} for the completion). Please reduce the length.",
                           param=param, code="context_length_exceeded")

    @staticmethod
    def check_chars(served, num_chars, param, room=None, where="prompt"):
        """Before tokenizing: text longer than `room` tokens (default: the context) could ever hold, at the
        most characters any one token covers, is refused without being tokenized."""
        room = served.max_model_len if room is None else room
        if num_chars > room * served.token_chars:
            raise APIError(400, f"This model's maximum context length is {served.max_model_len} tokens. The "
                                f"{where} has {num_chars} characters, more than {room} tokens can hold (no "
                                f"token of this model covers more than {served.token_chars} characters), so "
                                f"it was refused without being tokenized. Please reduce the length.",
                           param=param, code="context_length_exceeded")

    @staticmethod
    def check_message_count(served, count, param):
        """A chat of more messages than MAX_MESSAGES (or than the context has tokens: each message renders
        to one at least) is refused before the template renders it, which would hold the model's
        tokenizer thread, and every other chat to that model, for seconds."""
        limit = min(MAX_MESSAGES, served.max_model_len)
        if count > limit:
            raise APIError(400, f"a chat may have at most {limit} messages for model `{served.name}` "
                                f"(limit {MAX_MESSAGES}, or its context of {served.max_model_len} tokens); "
                                f"got {count}", param=param, code="too_many_messages")

    def session(self, session_id):
        """(Served, Session) of an open session; 404 when it was closed or never opened."""
        if session_id not in self.sessions:
            raise APIError(404, f"no session `{session_id}` (closed, or never opened)", param="session_id",
                           code="session_not_found")
        return self.sessions[session_id]

    @staticmethod
    def check_idle(session, session_id):
        if session.seq.status is not Status.IDLE:
            raise APIError(409, f"session `{session_id}` has a request in flight; wait for it to end",
                           param="session_id", code="session_busy")

    def tokenizer_model(self, name: str | None) -> Served:
        """The model a tokenizer route names (the only one, when it names none) that has a tokenizer."""
        if name is None and len(self.models) > 1:
            raise APIError(400, f"name the model: this server serves {', '.join(self.models)}", param="model")
        served = self.model(name if name is not None else next(iter(self.models)))
        if served.tokenizer is None:
            raise APIError(400, f"model {served.name} has no tokenizer", param="model")
        return served

    # -- prompts (tokenized on the model's tokenizer thread) ----------------------------------------------
    async def tokenize(self, served: Served, text: str, add_special_tokens: bool = True) -> list[int]:
        """vLLM's /tokenize: `text` as the tokenizer reads it, special tokens parsed."""
        self.check_chars(served, len(text), "prompt")
        tokenizer = served.tokenizer
        return await served.on_worker(lambda: tokenizer.encode(text, add_special_tokens=add_special_tokens))

    async def detokenize(self, served: Served, token_ids: list[int]) -> str:
        bad = [t for t in token_ids if not 0 <= t < served.vocab_size]
        if bad:
            raise APIError(400, f"token ids {bad[:5]} are outside the vocabulary [0, {served.vocab_size})",
                           param="tokens")
        tokenizer = served.tokenizer
        return await served.on_worker(lambda: tokenizer.decode(token_ids))

    async def decode_each(self, served: Served, ids_list: list[list[int]]) -> list[str]:
        """Each prompt's text as the tokenizer writes it back (what `echo` returns); "" without a tokenizer."""
        tokenizer = served.tokenizer
        if tokenizer is None:
            return [""] * len(ids_list)
        return await served.on_worker(lambda: [tokenizer.decode(ids) for ids in ids_list])

    async def completion_prompts(self, served, body):
        prompt = body.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise APIError(400, "prompt is empty", param="prompt")
        for p in prompt:  # what can be judged without tokenizing, first
            if isinstance(p, str):
                self.check_chars(served, len(p), "prompt")
            else:
                self.check_length(served, len(p), body.max_tokens, "prompt")
        encode = served.engine.engine.encode
        try:
            ids_list = await served.on_worker(lambda: [encode(p) for p in prompt])
        except ValueError as error:
            raise APIError(400, str(error), param="prompt")
        for ids in ids_list:
            self.check_length(served, len(ids), body.max_tokens, "prompt")
        return ids_list

    async def prompt_ids(self, served, prompt, max_tokens=None, param="prompt"):
        """One prompt (text or token ids) to token ids, checked against the context."""
        if isinstance(prompt, str):
            self.check_chars(served, len(prompt), param)
        else:
            self.check_length(served, len(prompt), max_tokens, param)
        try:
            ids = await served.on_worker(served.engine.engine.encode, prompt)
        except ValueError as error:
            raise APIError(400, str(error), param=param)
        self.check_length(served, len(ids), max_tokens, param)
        return ids

    async def chat_ids(self, served, messages, template_kwargs, max_tokens=None, param="messages", tools=None):
        """Token ids of a chat under the model's template; tools: those offered, rendered by the template."""
        self.check_message_count(served, len(messages), param)
        conversation, chars = [], 0
        for i, m in enumerate(messages):
            if m.role not in ROLES:
                raise APIError(400, f"messages[{i}].role: unknown role {m.role!r}; the roles are "
                                    f"{', '.join(ROLES)}", param=f"messages[{i}].role", code="invalid_value")
            content = m.content
            if isinstance(content, list):  # content parts: only text ones can be served here
                if any(part.get("type") != "text" for part in content):
                    raise APIError(400, "only text content parts are supported", param=f"messages[{i}].content")
                content = "".join(str(part.get("text", "")) for part in content)
            if m.role == "tool" and m.tool_call_id is None:
                raise APIError(400, f"messages[{i}].tool_call_id: a tool message needs the id of the call it "
                                    f"answers", param=f"messages[{i}].tool_call_id")
            message = {"role": "system" if m.role == "developer" else m.role, "content": content or "",
                       **template_fields(m)}
            if m.untrusted is not None:
                message["untrusted"] = m.untrusted
            # the whole message counts, not its content only: calls, names and ids are rendered too
            chars += len(message["content"]) + sum(len(json.dumps(v, ensure_ascii=False))
                                                   for k, v in message.items() if k not in ("content", "role"))
            conversation.append(message)
        if served.llm.tokenizer is None:
            raise APIError(400, f"model `{served.name}` has no tokenizer, so no chat template", param="model")
        self.check_chars(served, chars, param, where="messages' content")
        uses_tools = bool(tools) or any("tool_calls" in m or m["role"] == "tool" for m in conversation)
        template_kwargs = tools_template_kwargs(served, template_kwargs, uses_tools)
        if tools:
            template_kwargs["tools"] = tools
        try:
            ids = await served.on_worker(render_chat, served.llm.tokenizer, conversation, **template_kwargs)
        except (ChatTemplateError, TypeError, ValueError) as error:
            raise APIError(400, f"the chat template cannot render these messages: {error}", param=param)
        except Exception as error:  # jinja2 errors raised by the template itself (e.g. "roles must alternate")
            raise APIError(400, f"the chat template refused these messages: {error}", param=param)
        self.check_length(served, len(ids), max_tokens, param, where="messages")
        return ids

    async def append_ids(self, served, session, text, token_ids):
        """Token ids to append to a session: text tokenized as plain text (no special tokens parsed)."""
        room = served.max_model_len - session.num_tokens
        if text is not None:
            self.check_chars(served, len(text), "text", room=room, where="appended text")
            if served.llm.tokenizer is None:
                raise APIError(400, f"model `{served.name}` has no tokenizer: append token_ids", param="text")
            return await served.on_worker(served.llm.encode_plain, text)
        self.check_length(served, session.num_tokens + len(token_ids), None, "token_ids", where="session")
        return token_ids

    # -- sessions ----------------------------------------------------------------------------------------
    def check_room_for_session(self):
        if len(self.sessions) >= self.max_sessions:
            raise APIError(429, f"{len(self.sessions)} sessions are open (limit {self.max_sessions}); close some",
                           type="rate_limit_exceeded", code="rate_limit_exceeded")

    async def open_session(self, served: Served, prompt: str | list[int] | None, messages: list[Message] | None,
                           template_kwargs: dict | None) -> tuple[str, Session]:
        """A new session on a prompt (text or token ids) or on chat messages: (its id, the Session)."""
        if (prompt is None) == (messages is None):
            raise APIError(400, "give either prompt or messages", param="prompt")
        self.check_room_for_session()
        if messages is not None:
            ids = await self.chat_ids(served, messages, template_kwargs)
        else:
            ids = await self.prompt_ids(served, prompt)
        self.check_room_for_session()  # others may have opened theirs while this prompt was tokenized
        session = await served.engine.open_session(ids, tag="session")
        session_id = new_id("sess")
        self.sessions[session_id] = (served, session)
        return session_id, session

    async def append_to_session(self, session_id: str, text: str | None,
                                token_ids: list[int] | None) -> tuple[Session, int]:
        """Text or token ids appended to an idle session: (the Session, tokens appended)."""
        served, session = self.session(session_id)
        if (text is None) == (token_ids is None):
            raise APIError(400, "give either text or token_ids", param="text")
        self.check_idle(session, session_id)
        ids = await self.append_ids(served, session, text, token_ids)
        served, session = self.session(session_id)  # closed while its text was tokenized: 404
        self.check_idle(session, session_id)
        try:
            added = await served.llm.extend(session, ids)
        except ValueError as error:
            raise APIError(400, str(error), param="text" if text is not None else "token_ids")
        return session, added

    async def continue_session(self, session_id: str, body: SessionContinue, request: Request | None,
                               arrival: float) -> tuple[Served, Session, object]:
        """One turn generated on an idle session: (Served, Session, its RequestOutput)."""
        served, session = self.session(session_id)
        self.check_idle(session, session_id)
        max_tokens = body.max_tokens
        self.check_length(served, session.num_tokens, max_tokens, "max_tokens", where="session")
        if max_tokens is None:
            max_tokens = served.room(session.num_tokens)
        params = sampling_params(body, max_tokens, body.logprobs)
        self.admit(served)
        served.in_flight += 1
        try:
            (out,) = await self.wait(request, [self.run_one(served, session, params, arrival, tag="turn")])
        except ValueError as error:
            raise APIError(400, str(error), param="max_tokens")
        except RuntimeError:
            if session.closed:
                raise APIError(409, f"session `{session_id}` was closed (DELETE) while this continue ran; "
                                    f"what it generated is gone with it", param="session_id",
                               code="session_closed") from None
            raise
        finally:
            served.in_flight -= 1
        return served, session, out

    async def close_session(self, session_id: str) -> None:
        served, session = self.session(session_id)
        del self.sessions[session_id]
        await served.engine.close_session(session)

    # -- running requests ------------------------------------------------------------------------------
    async def tracked(self, served, prompt, params, arrival, count_prompt=True, tag="serve"):
        """The engine stream of one request (token ids, or a Session for a turn), each step's Sequence
        observed for the metrics; counted when it ends, however it ends (an aborted one: the tokens it had)."""
        track, seq = self.metrics.track(served, arrival, count_prompt), None
        try:
            async with aclosing(served.engine.stream(prompt, params, tag=tag)) as stream:
                async for seq in stream:
                    track.observe(seq)
                    yield seq
        except (asyncio.CancelledError, GeneratorExit):
            if seq is None:  # given up before its first step: counted as an abort all the same
                track.end_unstarted(prompt)
            raise
        finally:
            track.end(seq)

    async def run_one(self, served, prompt, params, arrival, count_prompt=True, tag="serve"):
        """One request to its end; its RequestOutput."""
        seq = None
        async with aclosing(self.tracked(served, prompt, params, arrival, count_prompt, tag)) as seqs:
            async for seq in seqs:
                pass
        return served.engine.output(seq)

    async def wait(self, request, coros):
        """Run the coroutines (one request's engine requests) together and return their results. The client
        gone: they are cancelled (aborted, their blocks freed) and 499; the shutdown timeout run out: the
        same, and 503. One failing: the others are cancelled and its error raised."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        together = asyncio.gather(*tasks)
        together.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved, even if unread
        gone = asyncio.ensure_future(client_gone(request)) if request is not None else None
        try:
            while not together.done():
                await asyncio.wait([together, self.expiry()] + ([gone] if gone else []), timeout=0.5,
                                   return_when=asyncio.FIRST_COMPLETED)
                if together.done():
                    break
                if self.expired:
                    raise self.shutdown_error()
                if gone is not None and gone.done():
                    raise APIError(499, "the client closed the connection", code="client_closed")
            return together.result()
        finally:
            if gone is not None:
                gone.cancel()
            for task in tasks:
                task.cancel()  # no-op for those that ended; the others abort their engine requests
            await asyncio.wait(tasks)

    async def generate(self, served, request, ids_list, param_lists, arrival):
        """Non-streamed: every (prompt, choice) as one engine request; a client gone cancels them."""
        jobs = [(ids, p, j == 0) for ids, params in zip(ids_list, param_lists) for j, p in enumerate(params)]
        self.admit(served, len(jobs))
        served.in_flight += len(jobs)
        try:
            return await self.wait(request, [self.run_one(served, ids, p, arrival, first) for ids, p, first in jobs])
        except ValueError as error:
            raise APIError(400, str(error), param="max_tokens" if "max_tokens" in str(error) else None)
        except ImportError as error:  # a structured output without the grammar engine installed
            raise APIError(400, str(error), param="response_format")
        finally:
            served.in_flight -= len(jobs)

    def count(self, served, outs, prompt_lens, n):
        """usage: prompt tokens once per prompt; cached tokens as the first choice of each prompt found them."""
        cached = sum(outs[i * n].num_cached_tokens for i in range(len(prompt_lens)))
        generated = sum(len(o.token_ids) for o in outs)
        return {"prompt_tokens": sum(prompt_lens), "completion_tokens": generated,
                "total_tokens": sum(prompt_lens) + generated, "prompt_tokens_details": {"cached_tokens": cached}}

    # -- shutdown ----------------------------------------------------------------------------------------
    def expiry(self):
        """A future of the running loop, done when the shutdown timeout has run out."""
        loop = asyncio.get_running_loop()
        if self._expired is None or self._expired.get_loop() is not loop:
            self._expired = loop.create_future()
        return self._expired

    @property
    def expired(self):
        return self._expired is not None and self._expired.done()

    def shutdown_error(self):
        return APIError(503, f"the server is shutting down and this request did not end within the shutdown "
                             f"timeout ({self.shutdown_timeout:g} s); it was aborted", type="server_error",
                        code="server_shutting_down")

    def on_expiry(self, callback):
        """Call callback() when the shutdown timeout runs out (now, if it has); returns the unregister."""
        if self.expired:
            callback()
            return lambda: None
        self._on_expiry.add(callback)
        return lambda: self._on_expiry.discard(callback)

    async def drain(self, timeout):
        """After the requests ended at a shutdown: wait (at most `timeout` s) until no engine holds a request,
        so that those aborted at the shutdown timeout leave their engines before the event loop ends."""
        deadline = time.monotonic() + timeout
        while any(s.engine.engine.has_work() for s in self.models.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def begin_shutdown(self):
        """On the event loop, when the server begins to stop: new requests get 503; those in flight have
        shutdown_timeout seconds to end, then get 503 (a stream: an error event) and are aborted."""
        if self.stopping:
            return
        self.stopping = True
        expired, loop = self.expiry(), asyncio.get_running_loop()

        def expire():
            if not expired.done():
                expired.set_result(None)
            for callback in list(self._on_expiry):
                callback()
            self._on_expiry.clear()
        loop.call_later(max(0.0, self.shutdown_timeout), expire)


async def client_gone(request):
    """Returns once the client has closed the connection. The route has read the body, so the next ASGI
    message is the disconnect; waiting for it (rather than polling is_disconnected, whose zero-time receive
    some Starlette/AnyIO versions cancel before a waiting message is taken) sees every disconnect."""
    while (await request.receive()).get("type") != "http.disconnect":
        pass
