"""How the server writes its answers: ids, finish reasons, OpenAI's two logprobs shapes, streamed text
deltas and server-sent events."""
from __future__ import annotations

import json
import secrets


def new_id(prefix):
    return f"{prefix}-{secrets.token_hex(12)}"


def finish_reason(reason):
    """OpenAI knows `length` and `stop`; every other way a request ends (eos, a stop string) is `stop`."""
    return "length" if reason == "length" else "stop"


def _token_text(tokenizer, token_id, as_ids):
    if as_ids or tokenizer is None:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id])


def chat_logprobs(tokenizer, token_ids, logprobs, top, as_ids):
    """OpenAI's chat logprobs.content for generated tokens (each entry: the token, then its top ones)."""
    content = []
    for token_id, entry in zip(token_ids, logprobs or []):
        text = _token_text(tokenizer, token_id, as_ids)
        ranked = sorted(entry.items(), key=lambda kv: -kv[1])[:top]
        content.append({"token": text, "logprob": entry[token_id], "bytes": list(text.encode()),
                        "top_logprobs": [{"token": (t := _token_text(tokenizer, i, as_ids)), "logprob": lp,
                                          "bytes": list(t.encode())} for i, lp in ranked]})
    return {"content": content}


def completion_logprobs(tokenizer, token_ids, logprobs, top, as_ids, offset=0):
    """OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, values, tops, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, logprobs or []):
        text = _token_text(tokenizer, token_id, as_ids)
        tokens.append(text)
        values.append(entry[token_id])
        ranked = sorted(entry.items(), key=lambda kv: -kv[1])[:top]
        tops.append({_token_text(tokenizer, i, as_ids): lp for i, lp in ranked})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def echo_logprobs(tokenizer, prompt_ids, prompt_logprobs, as_ids):
    """The echoed prompt's part of completions logprobs (vLLM's shape): the first token's log-probability
    and top are null; each later token's top holds its position's top k and the token itself."""
    tokens, values, tops, offsets, offset = [], [], [], [], 0
    for token_id, entry in zip(prompt_ids, prompt_logprobs):
        text = _token_text(tokenizer, token_id, as_ids)
        tokens.append(text)
        values.append(None if entry is None else entry[token_id])
        tops.append(None if entry is None else {_token_text(tokenizer, i, as_ids): lp for i, lp in
                                                 sorted(entry.items(), key=lambda kv: -kv[1])})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}, offset


def vllm_prompt_logprobs(tokenizer, prompt_logprobs):
    """vLLM's `prompt_logprobs` field: per prompt token null or {token id: {logprob, decoded_token}}."""
    return [None if entry is None else
            {str(i): {"logprob": lp, "decoded_token": _token_text(tokenizer, i, False)} for i, lp in entry.items()}
            for entry in prompt_logprobs]


def decode_keeping(tokenizer, token_ids, keep):
    """Generated text with special tokens skipped, except those in `keep` (id -> text: a tool call
    parser's markers, e.g. Mistral's [TOOL_CALLS]), which are written as their text."""
    parts, run = [], []
    for token_id in token_ids:
        if token_id in keep:
            parts += [tokenizer.decode(run, skip_special_tokens=True), keep[token_id]]
            run = []
        else:
            run.append(token_id)
    parts.append(tokenizer.decode(run, skip_special_tokens=True))
    return "".join(parts)


def output_text(tokenizer, out, stops, keep=None):
    """An output's text (the engine's: cut before a stop string), with the `keep` special tokens written."""
    if not keep:
        return out.text
    text = decode_keeping(tokenizer, out.token_ids, keep)
    return text[:min([text.find(s) for s in stops if s in text], default=len(text))]


class TextStream:
    """The text of a streamed request, sent as deltas that reassemble to exactly the final text: a
    partly decoded character, or an ending that may be the start of a stop string, waits. keep: special
    tokens written as their text (decode_keeping)."""

    def __init__(self, tokenizer, stops, keep=None):
        self.tokenizer, self.stops, self.keep, self.sent = tokenizer, stops, keep, ""

    def delta(self, token_ids, final_text=None):
        if final_text is not None:
            text = final_text
        elif self.tokenizer is None:
            return ""
        else:
            text = (decode_keeping(self.tokenizer, token_ids, self.keep) if self.keep else
                    self.tokenizer.decode(token_ids, skip_special_tokens=True)).rstrip("\ufffd")
            hold = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            text = text[:len(text) - hold]
        if not text.startswith(self.sent):  # decoding more tokens changed earlier text: wait for more
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


def sse(data):
    """One server-sent event carrying `data` as compact JSON."""
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
