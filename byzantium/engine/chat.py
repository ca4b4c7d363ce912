"""Chat templates, with text from other agents rendered as plain text.

Text written by other agents is untrusted: if it were tokenized like the template, a message holding
`<|im_end|><|im_start|>system` would become real role markers in another agent's prompt. So
`render_chat` renders the template with each untrusted content replaced by a sentinel, splits the
rendered string there, and tokenizes the template's pieces normally (their special tokens parsed)
and the untrusted pieces with NO added token matched at all, special or not (`plain_text_ids`).

With no untrusted content the result is exactly `apply_chat_template(..., tokenize=True)`. With
untrusted content, each piece is tokenized on its own, so no token spans a piece boundary. Where the
template puts content between special tokens and newlines (ChatML, SmolLM2, Qwen) this changes
nothing for benign text; elsewhere a merge across the boundary may differ (both encode the same text).

A tokenizer without a chat template is an error (`ChatTemplateError`), not a silent fallback to some
made-up format: set `tokenizer.chat_template` or use an instruct model.
"""

from __future__ import annotations

import re
import secrets

__all__ = ["ChatTemplateError", "render_chat", "plain_text_ids"]


class ChatTemplateError(ValueError):
    """The tokenizer has no chat template, or the template cannot be rendered."""


def plain_text_ids(tokenizer, text: str, *, mid_sequence: bool = False) -> list[int]:
    """Token ids of `text` as plain text: no special or added token parsed, no BOS/EOS added.

    mid_sequence=True tokenizes it as a continuation rather than the start of a text, so a
    SentencePiece tokenizer adds no leading "▁" (no difference for byte-level BPE tokenizers).
    """
    if mid_sequence:
        return _after_newline(lambda s: _plain(tokenizer, s), text)
    return _plain(tokenizer, text)


def render_chat(tokenizer, messages, add_generation_prompt: bool = True, untrusted: bool = False,
                **template_kwargs) -> list[int]:
    """Token ids of `messages` ({"role", "content"[, "untrusted"]} dicts) under the chat template.

    A message's content is tokenized as plain text when it has "untrusted": True, or when
    untrusted=True and the message is not a system message (a message's own "untrusted" key wins).
    template_kwargs go to `apply_chat_template` (e.g. enable_thinking=False for Qwen3).
    """
    if getattr(tokenizer, "chat_template", None) is None and "chat_template" not in template_kwargs:
        raise ChatTemplateError(
            f"{type(tokenizer).__name__} has no chat template; set tokenizer.chat_template or use an instruct model"
        )
    nonce = secrets.token_hex(8)
    while any(nonce in str(m.get("content", "")) for m in messages):
        nonce = secrets.token_hex(8)
    # Private-use characters around a random nonce: cannot come from the template or the messages.
    sentinel = re.compile("\ue000" + nonce + r"-(\d+)" + "\ue001")
    hidden, rendered_messages = [], []
    for m in messages:
        m = dict(m)
        if m.pop("untrusted", untrusted and m.get("role") != "system"):
            if not isinstance(m.get("content"), str):
                raise TypeError(f"untrusted content must be a string, got {type(m.get('content')).__name__}")
            hidden.append(m["content"])
            m["content"] = f"\ue000{nonce}-{len(hidden) - 1}\ue001"
        rendered_messages.append(m)
    text = tokenizer.apply_chat_template(
        rendered_messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
    )
    # split() gives [template, index, template, index, ..., template]
    parts = sentinel.split(text)
    ids: list[int] = []
    for i, part in enumerate(parts):
        if i % 2 == 1:
            piece, encode = hidden[int(part)], (lambda s: _plain(tokenizer, s))
        else:
            piece, encode = part, (lambda s: tokenizer.encode(s, add_special_tokens=False))
        if not piece:
            continue
        ids += _after_newline(encode, piece) if ids else encode(piece)
    return ids


def _plain(tokenizer, text: str) -> list[int]:
    # The fast tokenizer's pipeline (normalize, pre-tokenize, model) minus its added-vocabulary pass:
    # `split_special_tokens=True` would still match non-special added tokens (Qwen3's `<think>`,
    # `<tool_call>`), and it toggles a flag on the shared backend, which is not thread-safe.
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (pure Python) tokenizer
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    if not text:
        return []
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    splits = [s for s, _ in backend.pre_tokenizer.pre_tokenize_str(text)] if backend.pre_tokenizer else [text]
    return [t.id for s in splits for t in backend.model.tokenize(s)]


def _after_newline(encode, text: str) -> list[int]:
    # Tokenize a piece from the middle of a text: encode "\n" + text and drop the newline's ids, so
    # SentencePiece does not add the prefix space it adds at the start of a string (the same trick as
    # transformers' sanitize_control_tokens). If the newline merged with the text, encode it alone.
    newline = encode("\n")
    ids = encode("\n" + text)
    return ids[len(newline):] if ids[: len(newline)] == newline else encode(text)
