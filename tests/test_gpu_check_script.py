"""bench/gpu_check.sh: plans its parts within a budget, runs each under its own stop, and leaves each
part's JSON and verdict as it ends (the CPU variants here prove the script itself has no errors)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gpu_parts():
    spec = importlib.util.spec_from_file_location("gpu_parts", ROOT / "bench" / "gpu_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _script(*args, out):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out))
    return subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_budget_plans_the_parts_that_fit_in_order_of_value(tmp_path):
    parts = _gpu_parts()
    run = _script("--budget", "600", "--plan", out=tmp_path)
    assert run.returncode == 0, run.stderr
    chosen = parts.plan(600)
    assert sum(p[2] + parts.KILL_AFTER_S for p in chosen) <= 600 and chosen[0][0] == 1
    assert f"parts {[p[0] for p in chosen]}" in run.stdout and not list(tmp_path.iterdir())  # --plan runs nothing
    assert [p[0] for p in parts.plan(10 ** 6)] == [p[0] for p in parts.PARTS]
    assert [p[0] for p in parts.plan(None, {3, 1})] == [1, 3]
    assert all(p[2] <= 240 for p in parts.PARTS)  # no part longer than ~4 minutes
    assert _script("--budget", "-5", out=tmp_path).returncode != 0


def test_a_part_writes_its_json_and_verdict_as_it_ends(tmp_path):
    run = _script("--smoke", "--part", "3", out=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    record = json.loads((tmp_path / "gpu_part3.json").read_text())
    assert record["status"] == "pass" and record["smoke"] and "batch invariance: PASS" in record["log_tail"]
    assert "part 3 PASS" in (tmp_path / "gpu_verdicts.txt").read_text()
    assert json.loads((tmp_path / "batch_invariance_smoke.json").read_text())["identical_tokens"] is True


def test_a_part_past_its_stop_is_ended_and_recorded(tmp_path):
    parts = _gpu_parts()
    slow = (9, "sleeps", 1, [sys.executable, "-c", "import time; time.sleep(60)"], None)
    assert parts.run_part(slow, str(tmp_path), smoke=False) is False
    record = json.loads((tmp_path / "gpu_part9.json").read_text())
    assert record["status"] == "timeout" and record["seconds"] < 20
    assert "part 9 TIMEOUT" in (tmp_path / "gpu_verdicts.txt").read_text()
