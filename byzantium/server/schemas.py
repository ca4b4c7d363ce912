"""Request bodies and error shapes of the OpenAI-compatible server.

Bodies are pydantic models that ignore unknown fields; sampling_params turns one into the engine's
SamplingParams. Extensions, named as vLLM names them where it has them: `return_token_ids`,
`return_tokens_as_token_ids`, `top_k`, `ignore_eos`, `stop_token_ids`, `chat_template_kwargs`,
`prompt_logprobs`, and a
message's `"untrusted": true` (its content tokenized as plain text: no special tokens parsed). Chat
bodies take OpenAI's tools, tool_choice and parallel_tool_calls (server/tools.py reads them).
Errors have OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

from typing import Any, Literal

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..backends import SamplingParams

MAX_LOGPROBS = 20  # the most top log-probabilities a request may ask for (OpenAI's limit)
# the most stop strings a request may give: past OpenAI's 4, since lm-eval's local-completions sends a
# task's whole `until` list plus the end-of-text token
MAX_STOP = 16
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1  # what a 64-bit generator seed holds
ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # OpenAI's message roles


# -- errors ------------------------------------------------------------------------------------------------
class APIError(Exception):
    def __init__(self, status, message, type="invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_body(message, type="invalid_request_error", param=None, code=None):
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(status, message, type="invalid_request_error", param=None, code=None):
    return JSONResponse(error_body(message, type, param, code), status)


def validation_error_response(error: RequestValidationError):
    """A body that failed to parse or validate, as a 400 naming the first field at fault."""
    first = error.errors()[0] if error.errors() else {}
    if first.get("type") == "json_invalid":
        return error_response(400, f"malformed JSON in the request body: {first.get('msg', '')}")
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = loc[0] if loc else None
    where = ".".join(loc) if loc else "the request body"
    message = first.get("msg", "invalid value").removeprefix("Value error, ")
    return error_response(400, f"{where}: {message}", param=param)


# -- request bodies (unknown fields ignored) ---------------------------------------------------------------
class Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    n: int = Field(1, ge=1, le=64)
    stream: bool = False
    stream_options: dict | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM's: the prompt tokens' log-probs
    # structured outputs: OpenAI's response_format, or vLLM's guided_* extensions (at most one of them)
    response_format: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop):
        if isinstance(stop, list) and len(stop) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(stop)}")
        return stop


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default for completions; 0 with echo or prompt_logprobs
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False

    def prompt_logprobs_asked(self):
        """How many top log-probabilities each prompt token gets, or None: vLLM's prompt_logprobs, else
        echo with logprobs (the echoed prompt's tokens are listed with theirs), else 0 when max_tokens is 0
        (the prompt alone is computed)."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        if self.echo and self.logprobs is not None:
            return self.logprobs
        return 0 if self.max_tokens == 0 else None


class TokenizeRequest(BaseModel):  # vLLM's /tokenize
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):  # vLLM's /detokenize
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]


class Function(BaseModel):  # a tool: a function the model may call
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of its arguments
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: Function


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):  # a call in an assistant message of the conversation
    model_config = ConfigDict(extra="ignore")
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[dict] | None = None
    untrusted: bool | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    # tool calls (server/tools.py)
    tools: list[Tool] | None = None
    tool_choice: str | dict | None = None  # "none", "auto", "required" or {"type": "function", "function": {"name"}}
    parallel_tool_calls: bool | None = None


class SessionOpen(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    prompt: str | list[int] | None = None
    messages: list[Message] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class SessionAppend(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str | None = None
    token_ids: list[int] | None = None


class SessionContinue(Sampling):
    model: str | None = None  # the session's model
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)



def sampling_params(body, max_tokens, logprobs, index=0, tool_grammar=None, prompt_logprobs=None):
    """SamplingParams of choice `index`: with a seed, choice i samples with seed + i (distinct choices).
    tool_grammar: the grammar that forces a tool call (server/tools.py), in place of response_format."""
    if body.seed is not None and body.seed + index > SEED_MAX:
        raise APIError(400, f"seed + {index} (choice {index} of n) is past 2**64 - 1; give a smaller seed",
                       param="seed")
    constraint, field = ({"grammar": tool_grammar}, "tool_choice") if tool_grammar else structured(body)
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
            seed=None if body.seed is None else body.seed + index, stop=body.stop,
            stop_token_ids=body.stop_token_ids or [], ignore_eos=body.ignore_eos, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty, **constraint)
    except ValueError as error:  # the engine's own checks: name the field its message names
        if constraint and any(k in str(error) for k in ("schema", "json", "regex", "choice", "grammar")):
            raise APIError(400, str(error), param=field)
        field = next((f for f in ("max_tokens", "temperature", "top_p", "top_k", "logprobs", "stop",
                                  "presence_penalty", "frequency_penalty") if f in str(error)), None)
        raise APIError(400, str(error), param=field)


GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def structured(body):
    """({SamplingParams constraint}, the field it came from) of response_format or a guided_* field; the
    engine enforces it while decoding (engine/grammar.py). At most one may be given."""
    asked = []
    format_ = body.response_format
    if format_ is not None:
        kind = format_.get("type")
        if kind == "json_object":
            asked.append(({"json_object": True}, "response_format"))
        elif kind == "json_schema":
            schema = (format_.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise APIError(400, "response_format json_schema needs json_schema.schema, a JSON Schema object",
                               param="response_format")
            asked.append(({"json_schema": schema}, "response_format"))
        elif kind != "text":
            raise APIError(400, f"response_format type {kind!r} is unknown; one of text, json_object, json_schema",
                           param="response_format")
    asked += [({key: getattr(body, name)}, name) for name, key in GUIDED.items() if getattr(body, name) is not None]
    if len(asked) > 1:
        raise APIError(400, f"give at most one of response_format and {', '.join(GUIDED)}; got "
                            f"{', '.join(field for _, field in asked)}", param=asked[1][1])
    return asked[0] if asked else ({}, None)
