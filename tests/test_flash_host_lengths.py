"""The flash-attn backend takes the longest query and sequence lengths from the runner (host ints),
instead of reading them back from the device once a layer; the runner gives them for every prefill step."""
import types

import torch

from byzantium.kernels import flash


def _fake_flash(calls):
    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):
        calls.append((max_q, max_k))
        return torch.zeros_like(q)
    return types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)


class NoHostRead(torch.Tensor):
    def tolist(self):
        raise AssertionError("read back from the device")


def test_given_lengths_are_used_and_nothing_is_read_back(monkeypatch):
    calls = []
    monkeypatch.setattr(flash, "_flash_attn", lambda: _fake_flash(calls))
    cache = torch.zeros(2, 256, 1, 8)
    cu, lens = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([10, 2], dtype=torch.int32)
    q = torch.zeros(5, 2, 8)
    monkeypatch.setattr(torch.Tensor, "tolist", NoHostRead.tolist)
    flash.append_prefill_attention(q, cache, cache, cu, lens, torch.zeros(2, 1, dtype=torch.int32), 0.1, max_lens=(3, 10))
    monkeypatch.undo()
    assert calls == [(3, 10)]
    monkeypatch.setattr(flash, "_flash_attn", lambda: _fake_flash(calls))
    flash.append_prefill_attention(q, cache, cache, cu, lens, torch.zeros(2, 1, dtype=torch.int32), 0.1)
    assert calls[-1] == (3, 10)  # without them: the same lengths, read back


def test_the_runner_gives_the_prefill_lengths(tiny_llama, monkeypatch):
    from byzantium import Engine, SamplingParams
    from byzantium.kernels import reference
    _, path = tiny_llama
    engine = Engine(path, num_blocks=64)
    seen = []
    real = reference.append_prefill_attention

    def record(*args, max_lens=None, **kwargs):
        seen.append(max_lens)
        return real(*args, max_lens=max_lens, **kwargs)
    monkeypatch.setattr(engine.runner.ops, "append_prefill_attention", record)
    engine.generate([[1, 2, 3, 4, 5], [6, 7]], SamplingParams(max_tokens=1, temperature=0.0))
    assert seen and seen[0] == (5, 5)
