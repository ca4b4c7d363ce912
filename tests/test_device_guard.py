"""Every forward pass runs with the engine's device current: Triton launches in the current device's
context, so an engine on cuda:1 would otherwise run its kernels in device 0's (only a second GPU shows
the failure itself; these show the guard is there and names the right device)."""
import contextlib

import torch

from byzantium import Engine, SamplingParams
from byzantium.engine import runner


def test_the_guard_makes_the_engines_cuda_device_current(monkeypatch):
    entered = []

    @contextlib.contextmanager
    def fake_device(device):  # torch.cuda.device would need a GPU to enter
        entered.append(device)
        yield
    monkeypatch.setattr(torch.cuda, "device", fake_device)
    with runner.device_guard(torch.device("cuda", 1)):
        pass
    assert entered == [torch.device("cuda", 1)]
    with runner.device_guard(torch.device("cpu")):  # nothing to make current on the CPU
        pass
    assert len(entered) == 1


def test_every_step_runs_inside_the_guard(monkeypatch, tiny_llama):
    _, path = tiny_llama
    engine = Engine(path, num_blocks=64)
    guarded, inside = [], []
    real_model = engine.runner.model

    @contextlib.contextmanager
    def recording_guard(device):
        guarded.append(device)
        inside.append(True)
        yield
        inside.pop()

    def model(*args, **kwargs):
        assert inside, "a forward pass ran outside the device guard"
        return real_model(*args, **kwargs)
    monkeypatch.setattr(runner, "device_guard", recording_guard)
    monkeypatch.setattr(engine.runner, "model", type("M", (), {"__call__": lambda s, *a, **k: model(*a, **k),
                                                                "compute_logits": real_model.compute_logits})())
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0))
    assert guarded and set(guarded) == {engine.device}
