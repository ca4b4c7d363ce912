"""AutoInject: a version that only finishes a cut-off piece (a truncated signature closed) plants no
error, so it is no rewrite: the piece stays and the run reports that nothing was rewritten."""
import asyncio
import json
from types import SimpleNamespace

from byzantium.protocols.resilience.autoinject import AutoInject, acceptable, completes


class Completer:
    """Answers every injection request by closing each piece, as a small model does with a cut-off line."""

    async def chat(self, messages, params=None, untrusted=False, tag=None):
        pieces = json.loads(messages[-1]["content"])
        return SimpleNamespace(text=json.dumps({k: v + "):" for k, v in pieces.items()}))


def test_closing_a_cut_off_signature_is_not_a_rewrite():
    assert completes("def add(a, b", "def add(a, b):") and completes("xs = [1, 2", " xs = [1, 2]; ")
    # the embedded model's "rewrite" in mas_main's smoke cell: the cut-off signature continued
    assert completes("def multiply(a: int,", "def multiply(a: int, b: int) -> int")
    assert not completes("x = 1", "x = 1 + 1")  # a whole piece extended changes its meaning
    assert not acceptable("def add(a, b", "def add(a, b):")
    # a change inside the piece is an error, however it ends
    assert acceptable("def add(a, b", "def add(a, c):") and acceptable("return x", "return x + 1")


def test_a_run_of_completions_rewrites_nothing():
    inject = AutoInject(pm=1.0, pe=1.0)
    text = "def add(a, b\n    return a + b"
    task = SimpleNamespace(id="t1", question="q", choices=None, gold="x", kind="code", metadata={})
    out, record = asyncio.run(inject.corrupt_message(Completer(), text, task, 0))
    assert out == text and record["chosen"] and record["rewritten"] == []
    assert inject.stats["pieces_rewritten"] == 0 and inject.stats["pieces_unchanged"] == len(record["chosen"])
