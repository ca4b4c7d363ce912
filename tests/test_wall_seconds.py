"""A run's wall seconds leave out the time this process waited for another process's CPU-kernel build
(kernels/cpu_ext.locked_build): the other process is played by a second open file holding the lock."""
import fcntl
import json
import threading
import time
from types import SimpleNamespace

from byzantium.experiments.runner import run_instances
from byzantium.kernels import cpu_ext

HOLD_S = 0.8


def test_waiting_for_another_build_is_not_wall_time(tmp_path):
    build_dir = tmp_path / "ext"
    build_dir.mkdir()
    held = open(build_dir / "byzantium.lock", "a")
    fcntl.flock(held, fcntl.LOCK_EX)  # another "process" is building
    threading.Timer(HOLD_S, lambda: fcntl.flock(held, fcntl.LOCK_UN)).start()
    before = cpu_ext.waited_seconds()

    async def solve(item):
        cpu_ext.locked_build(build_dir, lambda: None)  # the first kernel call of the run waits here
        return {"value": item.id}

    began = time.perf_counter()
    run_instances([SimpleNamespace(id="a")], solve, tmp_path / "run", progress=False)
    elapsed = time.perf_counter() - began
    held.close()
    waited = cpu_ext.waited_seconds() - before
    seconds = json.loads((tmp_path / "run" / "summary.json").read_text())["seconds"]
    assert waited >= HOLD_S - 0.05
    assert seconds <= elapsed - waited + 1e-6 and seconds < elapsed - (HOLD_S - 0.1)
