"""Same seed, same machine, same result: an RRMaj run on the embedded model writes the same
results.jsonl, byte for byte, when a second run starts while other processes load every core (the
kernel choice, and so the rounding, must not depend on how busy the machine was at start-up)."""
import os
import subprocess
import sys

CMD = ["-m", "byzantium.cli", "run", "rrmaj", "--agents", "3", "--corrupt", "1", "--chunk", "4",
       "--trajectories", "2", "--max-len", "12", "--task", "gen-arith", "--limit", "2", "--device", "cpu",
       "--no-progress"]


def test_rrmaj_results_do_not_depend_on_the_load(tmp_path):
    env = dict(os.environ, BYZANTIUM_KERNEL_CHOICE=str(tmp_path / "choice.json"))  # a fresh choice, made now
    # The loaded start comes first: it makes the choice that the quiet start then has to agree with.
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        subprocess.run([sys.executable, *CMD, "--out", str(tmp_path / "busy")], env=env, check=True,
                       capture_output=True, timeout=600)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    subprocess.run([sys.executable, *CMD, "--out", str(tmp_path / "quiet")], env=env, check=True,
                   capture_output=True, timeout=600)
    quiet, busy = ((tmp_path / d / "results.jsonl").read_bytes() for d in ("quiet", "busy"))
    assert (tmp_path / "choice.json").exists()  # the choice was made by these runs, not read from an older cache
    assert quiet.count(b"\n") == 2 and quiet == busy
