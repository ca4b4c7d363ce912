"""The LLM interface over any OpenAI-compatible server (`byzantium serve`, vLLM, SGLang, llama.cpp,
OpenAI itself), through the official `openai` client.

    llm = OpenAILLM("Qwen/Qwen3-8B", base_url="http://127.0.0.1:8000")

Chats go to /v1/chat/completions as messages: the server renders its own chat template, and a message
from another agent carries "untrusted": true (byzantium's server renders it as plain text; vLLM ignores
the key). Raw text and token ids go to /v1/completions. What works on token ids here (round-robin
sessions, logprob scoring, token-id prompts) needs the model's tokenizer on this machine:
tokenizer="auto" loads it when the model name resolves here (a known name, a path, a hub id).

Sessions are their token ids: each continue_ sends all of them to /v1/completions and the server's
prefix cache computes only what is new. byzantium's own server keeps the KV itself (/v1/sessions), so
there only the appended tokens are sent. Logprob scoring reads the top-20 log-probabilities of the next
token; a candidate outside them scores -inf (counted in stats["score_outside_top_k"]).

Extensions (vLLM's names): return_token_ids, return_tokens_as_token_ids, top_k, stop_token_ids,
ignore_eos, chat_template_kwargs, per-message "untrusted". A server that refuses one by name (OpenAI
does) is asked again without them, and never sent them again: then generated ids are re-encoded from
the text, and untrusted messages are rendered by that server's template like any other.

The client runs on its own event loop in a daemon thread: callers come from whichever loop they run on
(each asyncio.run of the experiment runner is a new one), while a client's connections belong to the
loop that opened them.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import threading
from pathlib import Path

import openai
import torch

from ..engine.chat import render_chat
from .base import LLM, Completion, TokenSession
from .openai_wire import (TOP_LOGPROBS, OpenAIBackendError, api_base, extra_field, load_openai_tokenizer,
                          refuses_extension, structured_fields, wire_messages)
from ..engine.sampling import SamplingParams

class OpenAISession(TokenSession):
    """A session of the openai backend: its token ids, and the server's session id when it keeps one."""

    def __init__(self, ids, remote=None):
        super().__init__(ids)
        self.remote = remote

    def __repr__(self):
        return f"OpenAISession(tokens={len(self.ids)}, remote={self.remote}, closed={self.closed})"


def _zero_stats():
    return dict(requests=0, prompt_tokens=0, cached_tokens=0, completion_tokens=0, failures=0, score_outside_top_k=0)


class OpenAILLM(LLM):
    def __init__(self, model, base_url, api_key=None, tokenizer="auto", max_concurrency=64, max_retries=5,
                 timeout=600, name=None, chat_template_kwargs=None, server_sessions=None):
        """server_sessions: None asks the server (byzantium's keeps sessions); False replays them always."""
        if not base_url:
            raise ValueError("the openai backend needs base_url: the server's address, e.g. http://127.0.0.1:8000")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.model = str(model)  # the name the server serves it under
        self.name = name or self.model
        self.base_url = api_base(base_url)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.tokenizer, self.model_dir = load_openai_tokenizer(self.model, tokenizer)
        self.extensions = True  # until the server refuses one
        self._served = None  # the server's /v1/models entry of this model ({} when it has none), once asked
        self.server_sessions = server_sessions
        self._vocab_size = None
        self._totals = _zero_stats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"openai {self.name}", daemon=True)
        self._thread.start()
        self._semaphore = asyncio.Semaphore(max_concurrency)  # used on self._loop only
        self.client = openai.AsyncOpenAI(base_url=self.base_url, max_retries=max_retries, timeout=timeout,
                                         api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY")

    # -- bookkeeping -----------------------------------------------------------------------------------
    @property
    def stats(self):
        s = dict(self._totals)
        # the names the runners read: tokens computed (not from the cache) and generated
        s["prefill_tokens"] = s["prompt_tokens"] - s["cached_tokens"]
        s["decode_tokens"] = s["completion_tokens"]
        return s

    def reset_stats(self):
        self._totals = _zero_stats()

    def describe(self):
        return {"backend": "openai", "base_url": self.base_url, "model": self.model}

    def close(self):
        if self._loop.is_closed():
            return
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self.client.close(), self._loop).result(timeout=10)
            except Exception:
                pass  # closing is best effort: the connections go with the loop
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(
                f"--backend openai: model {self.model!r} has no tokenizer on this machine, and this call needs one "
                "(round-robin sessions, logprob scoring and token-id prompts are rendered here). Serve it under a "
                "name that resolves here (smollm2-135m, a local path, a hub id) or pass tokenizer=PATH_OR_HUB_ID")
        return self.tokenizer

    def render_chat(self, messages, untrusted=False, add_generation_prompt=True):
        return render_chat(self._need_tokenizer(), messages, add_generation_prompt=add_generation_prompt,
                           untrusted=untrusted, **self.chat_template_kwargs)

    # -- requests --------------------------------------------------------------------------------------
    async def _request(self, endpoint, call, count=True):
        """Run call(client, extensions) on the client's loop, under the concurrency limit; a refusal of
        one of our extensions by name is asked once more without them. count=False: a failure that is
        expected (probing) is not counted."""
        async def run(extensions):
            async with self._semaphore:
                return await call(self.client, extensions)

        while True:
            extensions = self.extensions
            try:
                return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(extensions), self._loop))
            except openai.BadRequestError as error:
                if extensions and refuses_extension(str(error.message)):
                    self.extensions = False
                    continue
                failed, cause = error, f"the server refused it (400): {error.message}"
            except openai.APIStatusError as error:
                failed, cause = error, f"the server answered {error.status_code}: {error.message}"
            except openai.APIConnectionError as error:
                failed, cause = error, f"no answer from the server ({type(error).__name__}: {error})"
            self._totals["failures"] += count
            raise OpenAIBackendError(f"model {self.model!r}, {self.base_url}{endpoint}: {cause}") from failed

    def _sampling(self, params, chat, extensions):
        """The request's fields from SamplingParams: (keyword arguments, extra_body)."""
        kwargs = dict(max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p)
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if params.stop:
            kwargs["stop"] = list(params.stop)
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(params, name, 0):
                kwargs[name] = getattr(params, name)
        if params.logprobs is not None and chat:
            kwargs.update(logprobs=True, top_logprobs=params.logprobs)
        elif params.logprobs is not None:
            kwargs["logprobs"] = params.logprobs
        structured = structured_fields(params)
        if chat and "response_format" in structured:  # OpenAI's field; on /v1/completions vLLM's extension
            kwargs["response_format"] = structured.pop("response_format")
        if structured and not extensions:
            raise OpenAIBackendError(f"model {self.model!r}, {self.base_url}: {next(iter(structured))} is an "
                                     f"extension this server refused; it cannot constrain the output")
        if not extensions:
            return kwargs, {}
        extra = {"return_token_ids": True, **structured}
        if params.top_k > 0:
            extra["top_k"] = params.top_k
        if params.stop_token_ids:
            extra["stop_token_ids"] = list(params.stop_token_ids)
        if params.ignore_eos:
            extra["ignore_eos"] = True
        if params.logprobs is not None:
            extra["return_tokens_as_token_ids"] = True
        return kwargs, extra

    def _account(self, response, prompt_len=0):
        usage = getattr(response, "usage", None)
        prompt = getattr(usage, "prompt_tokens", None) or prompt_len
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) or 0
        self._totals["requests"] += 1
        self._totals["prompt_tokens"] += prompt
        self._totals["cached_tokens"] += cached
        self._totals["completion_tokens"] += getattr(usage, "completion_tokens", None) or 0
        return prompt, cached

    def _completion(self, response, choice, text, logprobs, prompt_len=0):
        prompt, cached = self._account(response, prompt_len)
        ids = extra_field(choice, "token_ids")
        if ids is None:
            ids = self.encode_plain(text) if self.tokenizer is not None and text else []
        finish = "length" if choice.finish_reason == "length" else "stop"
        return Completion(text, [int(t) for t in ids], finish, prompt, cached, logprobs)

    def _token_id(self, token):
        """A logprob entry's token: "token_id:N", else a token string looked up in the tokenizer."""
        if token.startswith("token_id:"):
            return int(token[len("token_id:"):])
        if self.tokenizer is None:
            return None
        i = self.tokenizer.convert_tokens_to_ids(token)
        if isinstance(i, int) and i != self.tokenizer.unk_token_id:
            return i
        ids = self.encode_plain(token)
        return ids[0] if len(ids) == 1 else None

    def _entry(self, pairs):
        return {i: lp for i, lp in ((self._token_id(t), lp) for t, lp in pairs) if i is not None}

    def _text_logprobs(self, choice, params):
        """A /v1/completions choice's logprobs as Completion.logprobs: per token {id: log-prob}."""
        lp = choice.logprobs
        if params.logprobs is None or lp is None or not lp.tokens:
            return None
        tops = lp.top_logprobs or [None] * len(lp.tokens)
        return [self._entry([(t, v), *(top or {}).items()]) for t, v, top in zip(lp.tokens, lp.token_logprobs, tops)]

    async def _complete(self, prompt, params, prompt_len=0):
        """/v1/completions: a text or token-id prompt."""
        async def call(client, ext):
            kwargs, extra = self._sampling(params, False, ext)
            return await client.completions.create(model=self.model, prompt=prompt, extra_body=extra, **kwargs)

        response = await self._request("/completions", call)
        choice = response.choices[0]
        return self._completion(response, choice, choice.text or "", self._text_logprobs(choice, params), prompt_len)

    # -- the LLM interface -----------------------------------------------------------------------------
    async def _generate(self, ids, params, tag=None):
        # A server refuses prompt + max_tokens beyond the context (400); the engine stops at its end
        # ("length"). Where the server says its context, ask for what fits, as the engine would give.
        limit = (await self._served_entry()).get("max_model_len")
        if isinstance(limit, int) and len(ids) < limit < len(ids) + params.max_tokens:
            params = dataclasses.replace(params, max_tokens=limit - len(ids))
        return await self._complete(list(ids), params, len(ids))

    async def generate(self, prompt, params=None, tag=None):
        params = params or SamplingParams()
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("empty prompt: a prompt needs at least one token")
            return await self._complete(prompt, params)  # the server tokenizes it
        if prompt and all(isinstance(m, dict) for m in prompt):
            return await self.chat(prompt, params, tag=tag)
        return await self._generate(self.prompt_ids(prompt), params, tag=tag)

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        params = params or SamplingParams()

        async def call(client, ext):
            kwargs, extra = self._sampling(params, True, ext)
            if ext and self.chat_template_kwargs:
                extra["chat_template_kwargs"] = self.chat_template_kwargs
            return await client.chat.completions.create(model=self.model, messages=wire_messages(messages, untrusted, ext),
                                                        extra_body=extra, **kwargs)

        response = await self._request("/chat/completions", call)
        choice = response.choices[0]
        logprobs = None
        if params.logprobs is not None and choice.logprobs is not None and choice.logprobs.content:
            logprobs = [self._entry([(c.token, c.logprob), *((t.token, t.logprob) for t in c.top_logprobs or [])])
                        for c in choice.logprobs.content]
        return self._completion(response, choice, choice.message.content or "", logprobs)

    async def _logprobs(self, ids, tag=None):
        async def call(client, ext):
            return await client.completions.create(
                model=self.model, prompt=list(ids), max_tokens=1, temperature=0, logprobs=TOP_LOGPROBS,
                extra_body={"return_tokens_as_token_ids": True} if ext else {})

        response = await self._request("/completions", call)
        self._account(response, len(ids))
        lp = response.choices[0].logprobs
        if lp is None or not lp.top_logprobs or not lp.top_logprobs[0]:
            self._totals["failures"] += 1
            raise OpenAIBackendError(
                f"model {self.model!r}, {self.base_url}/completions: the server does not return logprobs, so "
                "logprob scoring cannot run on it; --score-mode generate works without them")
        top = self._entry(lp.top_logprobs[0].items())
        if lp.tokens and lp.token_logprobs and lp.token_logprobs[0] is not None:
            top.update(self._entry([(lp.tokens[0], lp.token_logprobs[0])]))
        out = torch.full((max(self.vocab_size(), max(top, default=0) + 1),), -math.inf, dtype=torch.float32)
        for i, value in top.items():
            out[i] = value
        return out

    async def score(self, prompt, candidates, untrusted=False, tag=None):
        logprobs = await self.next_token_logprobs(prompt, untrusted, tag=tag)
        values = [float(logprobs[i]) if i < len(logprobs) else -math.inf for i in self.candidate_ids(candidates)]
        self._totals["score_outside_top_k"] += sum(v == -math.inf for v in values)
        return dict(zip(candidates, values))

    def vocab_size(self):
        """The model's vocabulary (its config's, when the model is here; else the tokenizer's; else 0)."""
        if self._vocab_size is None:
            size = 0
            if self.model_dir is not None and (Path(self.model_dir) / "config.json").is_file():
                config = json.loads((Path(self.model_dir) / "config.json").read_text())
                size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or 0
            if self.tokenizer is not None:
                size = max(size, len(self.tokenizer))
            self._vocab_size = size
        return self._vocab_size

    # -- sessions ----------------------------------------------------------------------------------------
    async def _served_entry(self) -> dict:
        """This model's entry in the server's GET /v1/models (asked once; {} when there is none)."""
        if self._served is None:
            try:
                models = await self._request("/models", lambda client, ext: client.models.list(), count=False)
                self._served = next((m.model_dump() for m in models.data if m.id == self.model), {})
            except OpenAIBackendError:  # a server without a model list
                self._served = {}
        return self._served

    async def _server_sessions(self):
        """Whether the server keeps sessions (/v1/sessions): byzantium's own (owned_by "byzantium")."""
        if self.server_sessions is None:
            self.server_sessions = (await self._served_entry()).get("owned_by") == "byzantium"
        return self.server_sessions

    async def _post(self, path, body):
        return await self._request(path, lambda client, ext: client.post(path, body=body, cast_to=object))

    async def open_session(self, prompt, untrusted=False):
        ids = self.prompt_ids(prompt, untrusted)  # rendered here: the session's ids must be known
        if await self._server_sessions():
            reply = await self._post("/sessions", {"model": self.model, "prompt": ids})
            return OpenAISession(ids, reply["id"])
        return OpenAISession(ids)

    async def extend(self, session, tokens_or_text):
        if session.closed:
            raise ValueError("extend on a closed session")
        ids = self.encode_plain(tokens_or_text) if isinstance(tokens_or_text, str) else [int(t) for t in tokens_or_text]
        if session.remote is not None and ids:
            await self._post(f"/sessions/{session.remote}/append", {"token_ids": ids})
        session.ids += ids
        return session.num_tokens

    async def continue_(self, session, params=None, tag=None):
        if session.closed:
            raise ValueError("continue_ on a closed session")
        params = params or SamplingParams()
        if session.remote is None:
            out = await self._generate(session.ids, params, tag=tag)
        else:
            kwargs, extra = self._sampling(params, False, True)
            reply = openai.types.Completion.model_validate(
                await self._post(f"/sessions/{session.remote}/continue", {**kwargs, **extra}))
            choice = reply.choices[0]
            out = self._completion(reply, choice, choice.text or "", self._text_logprobs(choice, params),
                                   session.num_tokens)
        session.ids += out.token_ids
        return out

    async def close_session(self, session):
        if session.closed:
            return
        session.closed = True
        if session.remote is not None:
            path = f"/sessions/{session.remote}"
            try:
                await self._request(path, lambda client, ext: client.delete(path, cast_to=object), count=False)
            except OpenAIBackendError:
                pass  # the server may have dropped it already (a restart); nothing is lost
