"""SamplingParams: how one request is decoded. The engine defines it (it enforces every field); the LLM
interface (backends) re-exports it, so protocols speak it through backends and never import the engine.
"""
import json
from dataclasses import dataclass, field

from .strict_schema import strict

# Structured outputs: the fields that constrain what a request may generate, at most one per request.
STRUCTURED = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    seed: int | None = None
    stop: list[str] | str | None = None  # stop strings; the text is cut before them
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # return this many top log-probabilities per generated token
    # the prompt tokens' log-probabilities (the first token has none), each with this many top ones
    # (vLLM's prompt_logprobs); max_tokens 0 then computes the prompt only
    prompt_logprobs: int | None = None
    # OpenAI's penalties on the tokens generated so far in this request: logit -= frequency * count
    # + presence * (count > 0). 0 = off (the default and the papers' setting).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Structured outputs, enforced while decoding (engine/grammar.py, llguidance: `byzantium[structured]`);
    # at most one: the output is a JSON value valid under a JSON schema (a dict, or its JSON text); any JSON
    # object (OpenAI's response_format {"type": "json_object"}); a match of a regular expression (the whole
    # output); exactly one of the strings in `choice`; or a sentence of a grammar (Lark, or GBNF).
    json_schema: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        least = 0 if self.prompt_logprobs is not None else 1  # 0 generates nothing: only for the prompt's logprobs
        if not isinstance(self.max_tokens, int) or self.max_tokens < least:
            raise ValueError(f"max_tokens must be an integer >= {least}, got {self.max_tokens!r}"
                             + ("" if least == 0 else " (0 only with prompt_logprobs)"))
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and (not isinstance(self.prompt_logprobs, int) or self.prompt_logprobs < 0):
            raise ValueError(f"prompt_logprobs must be an integer >= 0, got {self.prompt_logprobs!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        self._check_structured()

    def _check_structured(self) -> None:
        given = [name for name in STRUCTURED if getattr(self, name) not in (None, False)]
        if len(given) > 1:
            raise ValueError(f"at most one of {', '.join(STRUCTURED)} per request; got {' and '.join(given)}")
        if isinstance(self.json_schema, str):
            try:
                schema = json.loads(self.json_schema)
            except ValueError as error:
                raise ValueError(f"json_schema is not valid JSON: {error}") from None
            if not isinstance(schema, dict):
                raise ValueError(f"json_schema must be a JSON object, got {type(schema).__name__}")
        elif self.json_schema is not None:
            if not isinstance(self.json_schema, dict):
                raise ValueError(f"json_schema must be a dict or its JSON text, got {type(self.json_schema).__name__}")
            try:
                json.dumps(self.json_schema)
            except (TypeError, ValueError) as error:
                raise ValueError(f"json_schema cannot be written as JSON: {error}") from None
        if not isinstance(self.json_object, bool):
            raise ValueError(f"json_object must be True or False, got {self.json_object!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            if (not isinstance(self.choice, (list, tuple)) or not self.choice
                    or not all(isinstance(c, str) and c for c in self.choice)):
                raise ValueError(f"choice must be a non-empty list of non-empty strings, got {self.choice!r}")
            self.choice = list(self.choice)

    @property
    def structured(self) -> tuple[str, str] | None:
        """What constrains this request's output, as (kind, text) (kind: "json_schema", "regex", "choice" (a
        JSON list) or "grammar"); None when nothing does. Equal constraints give equal pairs. A schema's
        objects take only the properties they name unless they say otherwise (strict_schema.py)."""
        if self.json_schema is not None:
            schema = json.loads(self.json_schema) if isinstance(self.json_schema, str) else self.json_schema
            return "json_schema", json.dumps(strict(schema))
        if self.json_object:
            return "json_schema", '{"type": "object"}'
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", json.dumps(self.choice)
        if self.grammar is not None:
            return "grammar", self.grammar
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
