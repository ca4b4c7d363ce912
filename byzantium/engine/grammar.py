"""Structured outputs: what a request may generate, enforced token by token while it decodes.

A request's SamplingParams may carry one constraint: json_schema, json_object, regex, choice or grammar
(SamplingParams.structured). The engine gives such a request a grammar matcher when it is added
(Grammars.start: a bad schema or regex fails there, before the request is queued). Each time the
engine samples a set of rows, the tokens every constrained request's matcher allows next are computed
as one bitmask row each (one bit per token; all constrained rows at once, on llguidance's threads:
`masks`), and the sampler (sampling/cpu.py's or sampling/cuda.py's sample) draws from a copy of the logits in
which one batched operation has set every token a constrained row does not allow to -inf
(`apply_bitmask`, on the CPU and on CUDA). Rows without a constraint are untouched, and logprobs still
report the model's distribution.
The sampled token then advances the request's matcher (`advance`). EOS is allowed only where the
grammar is complete; a request whose grammar can go no further ends there (finish_reason "stop").

The grammar engine is llguidance (the `structured` extra): one 3 MB abi3 wheel with no dependencies
(xgrammar requires torch, triton and apache-tvm-ffi, so installing it may move the pinned torch;
outlines-core compiles a schema to a regex DFA ahead of time, slow for large schemas and without
recursive ones); a mask is cheap next to a decode step (an Earley parser over a lexer, computed
lazily, no precompilation per schema; bench/results/grammar_mask.md); it covers JSON Schema broadly
(vLLM's "guidance" backend), and takes regexes and Lark grammars as well (GBNF is converted), so
`grammar` came for free. JSON schemas are compiled without flexible whitespace (", " and ": " between
items, no newlines): a small model given free whitespace can emit it forever. A schema's own
"x-guidance" options override that. A schema's objects take only the properties they name unless they
say otherwise (sampling/strict_schema.py), and JSON mode and JSON schemas end within max_tokens, their
JSON whole (JsonCloser), and so do forced tool calls (tool_call_closing.py) and regexes
(regex_closing.py: matching, never cut inside a character).

Speculation (speculation.py) needs nothing more: its draft tokens are only inputs, every token kept is a
sampled one, drawn row after row from the grammar's mask for the state advanced through the tokens
before it, and a draft is kept only while it equals that token, so it is one the grammar accepts and no
matcher ever rolls back. Drafts the grammar would refuse are cut before they are computed
(`valid_prefix`, from draft_tokens). Riders (riders.py) sample from their leader's logits with their
own matcher and mask, so a constrained request may ride on an unconstrained one with the same tokens
(and the reverse): each gets what its own rows would have given, and parts when its token differs.
"""
import json
import sys
from collections import OrderedDict

import numpy as np
import torch

from .json_closing import JsonPrefix
from .json_schema import closing as schema_closing
from .json_schema import members
from .regex_closing import RegexCloser
from .regex_closing import automaton as regex_automaton
from .tool_call_closing import ToolCallCloser

INSTALL = ("structured outputs (SamplingParams json_schema, json_object, regex, choice, grammar) need the "
           "llguidance package: pip install 'byzantium[structured]'")
# JSON without free whitespace: item and key separators as json.dumps writes them.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NEG_INF_BITS = -8388608  # 0xFF800000 as an int32: the bits of float32 -inf
_executor = None


def load():
    """The llguidance module, or an ImportError that says how to install it."""
    try:
        import llguidance
        import llguidance.hf  # noqa: F401 - from_tokenizer
    except ImportError as error:
        raise ImportError(INSTALL) from error
    return llguidance


def available():
    try:
        load()
    except ImportError:
        return False
    return True


def grammar_text(llguidance, kind, text):
    """llguidance's grammar for a constraint (SamplingParams.structured). Not yet checked."""
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(ascii_digits(text))
    if kind in ("choice", "grammar"):  # a JSON list of strings; a Lark grammar, or GBNF
        return llguidance.grammar_from(kind, text)
    raise ValueError(f"unknown constraint kind {kind!r}")


def ascii_digits(regex):
    """`regex` with \\d as [0-9] and \\D as [^0-9]: the grammar engine's \\d is Unicode's (Python's re and
    JSON Schema patterns mean ASCII digits, and a model at T=0 did write other scripts' digits). Inside a
    class, \\d becomes 0-9; \\D there is left as it is (a class cannot hold a negation)."""
    out, in_class, i = [], False, 0
    while i < len(regex):
        char = regex[i]
        if char == "\\" and i + 1 < len(regex):
            escaped = regex[i + 1]
            if escaped == "d":
                out.append("0-9" if in_class else "[0-9]")
            elif escaped == "D" and not in_class:
                out.append("[^0-9]")
            else:
                out.append(char + escaped)
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
            out.append(char)
            if regex[i + 1:i + 2] == "^":  # a negation, then a leading "]" is a member
                out.append("^")
                i += 1
            if regex[i + 1:i + 2] == "]":
                out.append("]")
                i += 1
        elif char == "]" and in_class:
            in_class = False
            out.append(char)
        else:
            out.append(char)
        i += 1
    return "".join(out)


class GrammarState:
    """One request's matcher: it has consumed every token the request generated so far. A JSON mode or
    JSON schema request also has a `closer` (JsonCloser), and `closed_early` once its budget made it close."""

    __slots__ = ("matcher", "error", "closer", "closed_early")

    def __init__(self, matcher, closer=None):
        self.matcher, self.error, self.closer, self.closed_early = matcher, None, closer, False

    def advance(self, token):
        if self.error is None and not self.matcher.consume_token(token):
            self.error = self.matcher.get_error() or f"the grammar refused token {token}"

    @property
    def ended(self):
        """The grammar can go no further (it is complete, or took an EOS token)."""
        return self.matcher.is_stopped()

    def valid_prefix(self, tokens):
        """How many of `tokens`, in order, the grammar would accept from here."""
        return self.matcher.validate_tokens(list(tokens))

    def forced_token(self, seq):
        """The token this request must take now so that its JSON closes within max_tokens, or None."""
        if self.closer is None or self.error is not None:
            return None
        closing = self.closer.closing_tokens(seq.output_ids, seq.params.max_tokens - seq.num_output)
        if not closing or self.valid_prefix(closing) != len(closing):
            return None
        self.closed_early = True
        return closing[0]


class JsonCloser:
    """The bound on length of JSON mode and of a JSON schema (json_closing.py, json_schema/): a
    request whose tokens left are within `reserve` of the tokens that close its JSON is made to write
    them. `reserve` covers the most one sampled token can add to the closing: RESERVE for free JSON
    (e.g. `[{"` opens three things), plus, with a schema, the tokens of its longest member (a key begun
    must be given a value). So the closing always fits, and between two sampled tokens it grows by at most
    `reserve`: once computed, it need not be again until the tokens left could be within reach of it
    (`wait`). The request's text is read as it grows, each token's bytes once (JSON's structure is ASCII,
    so a character split between tokens can only be inside a string)."""

    RESERVE = 6

    def __init__(self, tokenizer, schema=None, reserve=RESERVE):
        self.tokenizer, self.prefix, self.read, self.schema = tokenizer, JsonPrefix(), 0, schema
        self.reserve, self.wait = reserve, 0

    def closing_tokens(self, output_ids, tokens_left):
        """The token ids of the closing when it must start now, else None."""
        if len(output_ids) > self.read:
            text = self.tokenizer.decode_bytes(list(output_ids[self.read:])).decode("utf-8", "replace")
            self.prefix.feed(text)
            self.read = len(output_ids)
        if self.wait > 0:
            self.wait -= 1
            return None
        text = self.prefix.closing() if self.schema is None else schema_closing(self.prefix, self.schema)
        if not text:
            return None
        if tokens_left > len(text) + self.reserve:  # a token is at least one character
            self.wait = (tokens_left - len(text) - self.reserve) // (self.reserve + 1)
            return None
        ids = self.tokenizer.tokenize_str(text)
        if len(ids) > tokens_left:  # a schema whose least answer is longer than the budget: it could come to
            self.wait = tokens_left  # fit only if the model's tokens shortened it faster than they spend the
            return None  # budget; not worth a closing a step
        return ids if tokens_left <= len(ids) + self.reserve else None


class Grammars:
    """An engine's grammars: its tokenizer as llguidance reads it (built on first use, and once: it is
    the costly part for a large vocabulary), and one matcher per distinct constraint, compiled once
    (milliseconds) and copied for each request (LLMatcher.deep_copy, microseconds); the newest
    `cache_size` constraints are kept."""

    def __init__(self, tokenizer, vocab_size, eos_token_ids, cache_size=256):
        self.hf_tokenizer, self.vocab_size = tokenizer, vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.cache_size = cache_size
        self.compiled = OrderedDict()  # (kind, text) -> a fresh LLMatcher
        self.reserves = {}  # (kind, text) of a JSON schema -> its JsonCloser's reserve
        self.automata = {}  # (kind, text) of a regex -> its Automaton (regex_closing.py), None if unread
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            llguidance = load()
            if self.hf_tokenizer is None:
                raise ValueError("structured outputs need the model's tokenizer; this model has none")
            try:
                self._tokenizer = llguidance.hf.from_tokenizer(self.hf_tokenizer, n_vocab=self.vocab_size,
                                                               eos_token=self.eos_token_ids or None)
            except ValueError as error:  # a slow (Python) tokenizer
                raise ValueError(f"structured outputs need a fast tokenizer: {error}") from None
        return self._tokenizer

    def compile(self, kind, text):
        """A fresh matcher for the constraint (kind, text), from the cache or compiled now. A constraint
        llguidance refuses (a bad regex, an unsupported schema) raises ValueError with its message."""
        key = (kind, text)
        matcher = self.compiled.get(key)
        if matcher is not None:
            self.compiled.move_to_end(key)
            return matcher
        llguidance = load()
        tokenizer = self.tokenizer
        grammar = grammar_text(llguidance, kind, text)
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise ValueError(f"invalid {kind} constraint: {error.strip()}")
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid {kind} constraint: {matcher.get_error()}")
        self.compiled[key] = matcher
        while len(self.compiled) > self.cache_size:
            old, _ = self.compiled.popitem(last=False)
            self.reserves.pop(old, None)
            self.automata.pop(old, None)
        return matcher

    def start(self, params):
        """A new request's GrammarState, or None when its params constrain nothing. JSON mode and a JSON
        schema get a JsonCloser, which ends them within max_tokens."""
        spec = params.structured
        if spec is None:
            return None
        matcher = self.compile(*spec).deep_copy()
        closer = None
        if params.json_object:
            closer = JsonCloser(self.tokenizer)
        elif spec[0] == "json_schema":
            schema = json.loads(spec[1])
            if spec not in self.reserves:
                self.reserves[spec] = JsonCloser.RESERVE + max(
                    [len(self.tokenizer.tokenize_str(t)) for t in members(schema)], default=0)
            closer = JsonCloser(self.tokenizer, schema, self.reserves[spec])
        elif spec[0] == "grammar":  # a forced tool call's grammar ends within max_tokens too
            closer = ToolCallCloser.of(self.tokenizer, spec[1], self.eos_token_ids)
        elif spec[0] == "regex" and self.eos_token_ids:  # and a regex, never inside a character
            if spec not in self.automata:
                self.automata[spec] = regex_automaton(ascii_digits(spec[1]))
            if self.automata[spec] is not None:
                closer = RegexCloser(self.tokenizer, self.automata[spec], self.eos_token_ids[0])
        return GrammarState(matcher, closer)


def executor():
    """llguidance's thread pool, which computes a step's masks in parallel."""
    global _executor
    if _executor is None:
        _executor = load().LLExecutor()
    return _executor


def state_of(request):
    return getattr(request, "grammar", None)


def masks(requests, vocab_size, pin=False):
    """The next-token masks of the constrained `requests` (each with .grammar: a GrammarState, or None):
    (their indices, an int32 bitmask [R, ceil(vocab_size / 32)] whose bit j of word w allows token 32 w + j),
    or None when none is constrained. A matcher in an error state allows everything (the request then ends
    with its error at the engine's stop check)."""
    rows = [i for i, r in enumerate(requests) if state_of(r) is not None]
    if not rows:
        return None
    words = (vocab_size + 31) // 32
    bitmask = torch.empty((len(rows), words), dtype=torch.int32, pin_memory=pin)
    computed = [(state_of(requests[i]).matcher, j) for j, i in enumerate(rows) if state_of(requests[i]).error is None]
    if computed:
        executor().unsafe_compute_mask_ptr(computed, bitmask.data_ptr(), words * 4, len(rows))
    for j, i in enumerate(rows):
        state = state_of(requests[i])
        if state.error is not None:
            bitmask[j] = -1
        forced = state.forced_token(requests[i])
        if forced is not None:  # only that token: JSON closing within its budget
            bitmask[j] = 0
            bitmask[j, forced // 32] = _bit(forced % 32)
    return rows, bitmask


def _bit(j):
    """Bit j of an int32 word, as a signed int32 value."""
    return (1 << j) - (1 << 32) * (j == 31)


def advance(requests, tokens):
    """Each constrained request's matcher takes the token sampled for it."""
    for request, token in zip(requests, tokens):
        state = state_of(request)
        if state is not None:
            state.advance(token)


def apply_bitmask(logits, allowed):
    """A copy of logits [N, V] in which the rows of `allowed` (row indices, int32 bitmask [R, >= V / 32],
    as `masks` returns) have -inf at every token their mask does not allow; the other rows as they were.

    The bits become a float addend, 0.0 where a token is allowed and -inf where not (the int32 pattern
    0xFF800000), added to those rows: no branch per token, so the cost is the same whatever the mask (a
    masked fill over real masks' runs is slower on the CPU: bench/results/grammar_mask.md). CPU: numpy
    unpacks the bits; CUDA: the packed mask (R x V / 8 bytes) is copied over and unpacked there."""
    rows, bitmask = allowed
    n, vocab = logits.shape
    if logits.device.type == "cpu" and sys.byteorder == "little":
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, count=vocab, bitorder="little").astype(np.int32)
        bits -= 1  # allowed: 0; refused: -1 (all bits set)
        bits &= NEG_INF_BITS
        addend = torch.from_numpy(bits.view(np.float32))
    else:
        words = bitmask.to(logits.device, non_blocking=bitmask.is_pinned())
        shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
        bits = (((words[:, :, None] >> shifts) & 1) - 1) & NEG_INF_BITS
        addend = bits.view(len(rows), -1)[:, :vocab].view(torch.float32)
    addend = addend.to(logits.dtype)
    if rows == list(range(n)):
        return logits + addend
    return logits.clone().index_add_(0, torch.tensor(rows, device=logits.device), addend)
