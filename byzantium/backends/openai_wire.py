"""What the openai backend sends and reads: the API's base URL, the local tokenizer, the extension
fields (vLLM's names) and a server's refusal of one, messages marked untrusted, fields the openai types
do not declare."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..engine.loader import HUB_ID, load_tokenizer, resolve_model

TOP_LOGPROBS = 20  # the most vLLM returns by default (its max_logprobs)
EXTENSIONS = ("return_token_ids", "return_tokens_as_token_ids", "top_k", "stop_token_ids", "ignore_eos",
              "chat_template_kwargs", "untrusted", "guided_regex", "guided_choice", "guided_grammar")


class OpenAIBackendError(RuntimeError):
    """A request the server refused or could not answer, after the client's retries."""


def api_base(base_url: str) -> str:
    """The client's base URL: "http://host:8000" means its /v1; a URL with a path is taken as given."""
    url = base_url.rstrip("/")
    scheme, _, rest = url.partition("://")
    return url + "/v1" if "/" not in rest else url


def load_openai_tokenizer(model, tokenizer="auto"):
    """(tokenizer or None, local model directory or None). "auto": the model's own, when its name
    resolves here, else None; a path or hub id: that one (a failure is an error); an object: itself.
    A hub id loads only the tokenizer's files, never the weights."""
    if tokenizer is None:
        return None, None
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer, None
    auto = tokenizer == "auto"
    name = str(model if auto else tokenizer)
    try:
        if HUB_ID.match(name) and not Path(name).expanduser().exists():
            from transformers import AutoTokenizer
            return AutoTokenizer.from_pretrained(name), None
        model_dir = resolve_model(name)
        return load_tokenizer(model_dir), model_dir
    except Exception as error:
        if auto:
            return None, None
        raise ValueError(f"cannot load the tokenizer {name!r}: {error}") from error


def extra_field(model, key):
    """A field the openai types do not declare (pydantic extra), or None."""
    extra = getattr(model, "model_extra", None) or {}
    return extra.get(key, getattr(model, key, None))


def refuses_extension(message):
    """A 400 that refuses one of our extension fields by name (OpenAI: "Unrecognized request argument
    supplied: top_k"; strict validators: "... 'untrusted' was unexpected")."""
    text = message.lower()
    return any(name in text for name in EXTENSIONS) and any(
        word in text for word in ("unrecognized", "unexpected", "unknown", "not allowed", "not permitted", "extra"))


def wire_messages(messages, untrusted, extensions):
    """The messages as sent: "untrusted": true where render_chat would render the content as plain text
    (the message's own key, else untrusted=True on a non-system message); without extensions, no key."""
    out = []
    for m in messages:
        m = dict(m)
        flag = m.pop("untrusted", untrusted and m.get("role") != "system")
        if flag and extensions:
            m["untrusted"] = True
        out.append(m)
    return out


def structured_fields(params):
    """SamplingParams' structured-output constraint as request fields: JSON as OpenAI's response_format,
    a regex, choice or grammar as vLLM's guided_* extensions (which our server takes too)."""
    spec = params.structured
    if spec is None:
        return {}
    kind, text = spec
    if params.json_object:
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "output", "schema": json.loads(text), "strict": True}}}
    if kind == "regex":
        return {"guided_regex": text}
    if kind == "choice":
        return {"guided_choice": json.loads(text)}
    return {"guided_grammar": text}
