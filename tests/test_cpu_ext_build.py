"""The CPU kernels' build lock: a build killed half way never blocks the next start, a process that
waits for another one's build gives up with a message after its bound, and each Python environment
builds in its own directory."""
import os
import signal
import subprocess
import sys
import time

import pytest

from byzantium.kernels import cpu_ext

# A stand-in for torch's build, as far as the lock is concerned: it takes the lock, leaves torch's own
# lock file behind as its loader does while ninja runs, and would run for a minute.
HOLDER = """
import sys, time
from pathlib import Path
from byzantium.kernels.cpu_ext import locked_build
d = Path(sys.argv[1])
def build():
    (d / "lock").write_text("")
    (d / "building").write_text("")
    time.sleep(60)
locked_build(d, build)
"""


def _start_holder(build_dir):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(build_dir)])
    end = time.monotonic() + 60
    while not (build_dir / "building").exists():
        assert proc.poll() is None and time.monotonic() < end, "the stand-in build never started"
        time.sleep(0.05)
    return proc


def test_a_build_killed_half_way_does_not_block_the_next_start(tmp_path):
    proc = _start_holder(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (tmp_path / "lock").exists()  # what made every later start wait forever

    def build():
        assert not (tmp_path / "lock").exists(), "torch's stale lock file was left for its loader to wait on"
        return "built"
    start = time.monotonic()
    assert cpu_ext.locked_build(tmp_path, build, wait_s=5) == "built"
    assert time.monotonic() - start < 5


def test_waiting_for_a_live_build_is_bounded_and_says_so(tmp_path, capsys):
    proc = _start_holder(tmp_path)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="another process has been building"):
            cpu_ext.locked_build(tmp_path, lambda: pytest.fail("built beside a live build"), wait_s=1)
        assert time.monotonic() - start < 5
        assert "waiting for another process" in capsys.readouterr().err
        assert (tmp_path / "lock").exists()  # a live build's lock file is left alone
    finally:
        proc.kill()
        proc.wait()


def test_each_environment_builds_in_its_own_directory(monkeypatch):
    here = cpu_ext.build_directory()
    monkeypatch.setattr(sys, "prefix", os.path.join(sys.prefix, "other-venv"))
    assert cpu_ext.build_directory() != here and cpu_ext.build_directory().parent == here.parent
