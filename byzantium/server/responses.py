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


class TextStream:
    """The text of a streamed request, sent as deltas that reassemble to exactly the final text: a
    partly decoded character, or an ending that may be the start of a stop string, waits."""

    def __init__(self, tokenizer, stops):
        self.tokenizer, self.stops, self.sent = tokenizer, stops, ""

    def delta(self, token_ids, final_text=None):
        if final_text is not None:
            text = final_text
        elif self.tokenizer is None:
            return ""
        else:
            text = self.tokenizer.decode(token_ids, skip_special_tokens=True).rstrip("\ufffd")
            hold = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            text = text[:len(text) - hold]
        if not text.startswith(self.sent):  # decoding more tokens changed earlier text: wait for more
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


def sse(data):
    """One server-sent event carrying `data` as compact JSON."""
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
