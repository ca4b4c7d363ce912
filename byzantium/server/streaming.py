"""Streamed completions and chats: every (prompt, choice) runs as its own engine stream, and their chunks
reach the client as server-sent events in the order tokens arrive."""
from __future__ import annotations

import asyncio
import time
import weakref
from contextlib import aclosing

from .responses import TextStream, chat_logprobs, completion_logprobs, finish_reason, new_id, output_text, sse
from .schemas import error_body
from .tool_parsers import ToolStream


def stream_choices(server, served, body, ids_list, params, object_name, arrival, echo=None, tools=None):
    """Server-sent events for every (prompt, choice): chunks as tokens arrive, then usage, then [DONE].
    Closing the response early (a client gone) closes every choice's engine stream: aborted, freed. The
    shutdown timeout running out ends the stream with an error event (server_shutting_down), then [DONE].
    tools: a chat's ToolPlan (server/tools.py); its calls are streamed as tool_calls deltas."""
    chat = object_name == "chat.completion.chunk"
    rid, created = new_id("chatcmpl" if chat else "cmpl"), int(time.time())
    count = sum(len(p) for p in params)
    server.admit(served, count)
    served.in_flight += count  # reserved now, so that a burst of streams cannot all pass admit
    released = False

    def release():  # once: when the stream ends, or when a stream never started is dropped
        nonlocal released
        if not released:
            released, served.in_flight = True, served.in_flight - count
    # (index, delta, finish, logprobs, new token ids, output) per event of a choice (a delta: text, or a
    # list of chat deltas when tool calls are parsed); an engine error puts "error" as the finish and its
    # message as the logprobs, a choice's stream ending puts "end" as the output
    queue = asyncio.Queue()
    tok = served.llm.tokenizer
    top = params[0][0].logprobs
    n = len(params[0])

    async def run(index, ids, p):
        keep = tools.keep if tools is not None else None
        text = TextStream(tok, p.stop, keep)
        calls = ToolStream(tools.parser, tools.single, tools.grammar is not None) if tools is not None and tools.parser else None
        sent_tokens = 0
        try:
            async with aclosing(server.tracked(served, ids, p, arrival, index % n == 0)) as seqs:
                async for seq in seqs:
                    ended = seq.finish_reason is not None
                    out = served.engine.output(seq) if ended else None
                    token_ids = list(seq.output_ids)
                    delta = text.delta(token_ids, output_text(tok, out, p.stop, keep) if ended else None)
                    finish = finish_reason(seq.finish_reason) if ended else None
                    if calls is not None:
                        delta = calls.feed(delta, ended)
                        if ended and calls.calls and finish != "length":
                            finish = "tool_calls"
                    new_tokens, sent_tokens = token_ids[sent_tokens:], len(token_ids)
                    if delta or ended or (top is not None and new_tokens):
                        logprobs = None
                        if top is not None:
                            lps = list(seq.logprobs)[len(token_ids) - len(new_tokens):len(token_ids)]
                            as_ids = body.return_tokens_as_token_ids
                            logprobs = (chat_logprobs(tok, new_tokens, lps, top, as_ids) if chat else
                                        completion_logprobs(tok, new_tokens, lps, top, as_ids, len(text.sent) - len(delta)))
                        await queue.put((index, delta, finish, logprobs, new_tokens, out))
        except Exception as error:  # noqa: BLE001 - reported in the stream, the others go on
            await queue.put((index, None, "error", str(error), [], None))
        finally:
            await queue.put((index, None, None, None, None, "end"))

    def chunk(choices, usage=None):
        data = {"id": rid, "object": object_name, "created": created, "model": served.name, "choices": choices}
        if usage is not None:
            data["usage"] = usage
        return sse(data)

    async def events():
        tasks = []
        for i, (ids, ps) in enumerate(zip(ids_list, params)):
            for j, p in enumerate(ps):
                tasks.append(asyncio.create_task(run(i * n + j, ids, p)))
        outs, running = {}, len(tasks)
        unregister = server.on_expiry(lambda: queue.put_nowait((None, None, "shutdown", None, None, None)))
        try:
            if chat:
                yield chunk([{"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for k in range(len(tasks))])
            elif echo and any(echo):
                yield chunk([{"index": k, "text": echo[k // n], "logprobs": None, "finish_reason": None}
                             for k in range(len(tasks))])
            while running:
                index, delta, finish, logprobs, new_tokens, out = await queue.get()
                if out == "end":
                    running -= 1
                    continue
                if finish == "error":
                    yield sse(error_body(logprobs, "server_error"))
                    continue
                if finish == "shutdown":
                    error = server.shutdown_error()
                    yield sse(error_body(error.message, error.type, code=error.code))
                    break
                if out is not None:
                    outs[index] = out
                if not chat:
                    choice = {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish}
                    if body.return_token_ids:
                        choice["token_ids"] = new_tokens
                    yield chunk([choice])
                    continue
                # a chat's deltas, one chunk each: logprobs and token ids on the first, the finish on the last
                deltas = (delta if isinstance(delta, list) else [{"content": delta}] if delta else []) or [{}]
                for k, message in enumerate(deltas):
                    choice = {"index": index, "delta": message, "logprobs": logprobs if k == 0 else None,
                              "finish_reason": finish if k == len(deltas) - 1 else None}
                    if body.return_token_ids:
                        choice["token_ids"] = new_tokens if k == 0 else []
                    yield chunk([choice])
            if len(outs) == len(tasks):
                usage = server.count(served, [outs[k] for k in range(len(tasks))],
                                     [len(ids) for ids in ids_list], n)
                if (body.stream_options or {}).get("include_usage"):
                    yield chunk([], usage)
            yield "data: [DONE]\n\n"
        finally:
            unregister()
            release()
            for task in tasks:
                task.cancel()

    stream = events()
    weakref.finalize(stream, release)
    return stream
