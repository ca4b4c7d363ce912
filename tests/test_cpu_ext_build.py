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


def test_only_the_avx512_instantiations_hold_avx512_instructions():
    """The library loads and runs on an AVX2-only CPU (AMD Zen 2) because nothing but the kernels instantiated
    for cpu_simd.h's Avx512 and Avx512Bf16 traits holds an AVX-512 instruction (EVEX-encoded, or on zmm or mask
    registers), and the callers reach those only after checking the CPU. A helper compiled for two instruction
    sets under one name (the linker keeps either) would show up here, as would avx512_bf16 outside Avx512Bf16."""
    import re
    import shutil
    import subprocess
    objdump = shutil.which("objdump")
    ext = cpu_ext.load() if cpu_ext.supported() else None
    if objdump is None or ext is None:
        pytest.skip("no objdump, or no CPU kernels here")
    listing = subprocess.run([objdump, "-d", "-C", ext.__file__], capture_output=True, text=True, check=True).stdout
    function, avx512, bf16 = None, set(), set()
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            function = header.group(1)
            continue
        parts = line.split("\t")
        if len(parts) < 3:  # not an instruction (or the rest of a long one's bytes)
            continue
        code, text = parts[1].strip(), parts[2]
        if re.match(r"^(67 )?62 ", code) or "zmm" in text or re.search(r"%k[0-7]", text):
            avx512.add(function)
        if "bf16" in text.split(" ")[0]:
            bf16.add(function)
    assert avx512, "no AVX-512 instantiation found: the check reads the listing wrongly"
    assert [f for f in avx512 if "Avx512" not in f] == []
    assert [f for f in bf16 if "Avx512Bf16" not in f] == []


ZEN2 = """
import torch, torch.nn.functional as F
from byzantium.kernels import cpu_ext, reference
ext = cpu_ext.load()
assert not ext.avx512_supported() and not ext.avx512_bf16_supported() and not ext.prefill_supported(64)
g = torch.Generator().manual_seed(0)
x, w, up = torch.randn(20, 64, generator=g), torch.randn(40, 64, generator=g), torch.randn(48, 64, generator=g) / 8
torch.testing.assert_close(ext.panel_linear(x, ext.pack_panels(w), None, 40), F.linear(x, w), rtol=1e-5, atol=1e-4)
h = F.linear(x, up)
torch.testing.assert_close(ext.panel_glu(x, ext.pack_glu(up), None, 24), F.silu(h[:, :24]) * h[:, 24:], rtol=1e-5, atol=1e-5)
torch.testing.assert_close(ext.rms_norm(x, w[0], 1e-5), F.rms_norm(x, (64,), w[0], 1e-5), rtol=1e-5, atol=1e-5)
k = torch.randn(4, 16, 2, 64, generator=g)
q, lens, tables = torch.randn(2, 4, 64, generator=g), torch.tensor([5, 30], dtype=torch.int32), torch.tensor([[0, 1], [2, 3]])
for pool in (k, k.bfloat16()):  # avx512=True falls back to the AVX2 kernel here
    torch.testing.assert_close(ext.paged_decode_attention(q, pool, pool, lens, tables, 0.1),
                               reference.paged_decode_attention(q, pool.float(), pool.float(), lens, tables, 0.1))
assert ext.argmax_rows(x).tolist() == x.argmax(-1).tolist() and 0 <= ext.race_sample(x[0], 1, 2) < 64
print("ran")
"""


def test_the_kernels_run_on_an_emulated_avx2_only_cpu():
    """Under qemu's Zen 2 (EPYC-Rome: AVX2, no AVX-512; an AVX-512 instruction stops the process with SIGILL)
    the library loads, says it has no AVX-512, and its fp32 kernels run and match torch. Where qemu-user is not
    installed (apt-get install qemu-user), skipped."""
    import shutil
    import subprocess
    if shutil.which("qemu-x86_64") is None or not cpu_ext.supported() or cpu_ext.load() is None:
        pytest.skip("no qemu-x86_64, or no CPU kernels here")
    run = subprocess.run(["qemu-x86_64", "-cpu", "EPYC-Rome", sys.executable, "-c", ZEN2], capture_output=True,
                         text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0 and run.stdout.strip() == "ran", run.stderr[-2000:]
