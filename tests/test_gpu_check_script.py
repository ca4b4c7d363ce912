"""bench/gpu_check.sh: plans its parts within a budget, runs each under its own stop, and appends each
part's record to one bundle as it ends (the CPU variants here prove the script itself has no errors)."""
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


def _script(*args, out, **env_vars):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), **env_vars)
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
    assert _script("--budget", "-5", out=tmp_path).returncode != 0


def test_the_default_plan_fits_twice_in_the_lent_time():
    """15 minutes lent, start-up included (~2 minutes): the default plan's stops fit twice, the first
    part is the Triton kernels, and the FP8 kernels and linears are in it."""
    parts = _gpu_parts()
    default = parts.plan(parts.DEFAULT_BUDGET_S)
    total = sum(p[2] + parts.KILL_AFTER_S for p in default)
    assert total <= 8 * 60 and 2 * total + 120 <= 15 * 60
    assert default[0][0] == 1 and "TestTriton" in default[0][3]
    commands = [" ".join(p[3]) for p in default]
    assert any("test_fp8_experts.py" in c for c in commands) and any("fp8_check.py" in c for c in commands)
    assert all(p[3][0] != "python" for p in parts.PARTS)


def test_parts_append_to_one_bundle_as_they_end(tmp_path):
    run = _script("--smoke", "--part", "4", "--part", "6", out=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.json", "gpu_check.log"]
    bundle = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["part"] for r in bundle["parts"]] == [4, 6] and bundle["machine"]["torch"]
    fp8, drift = bundle["parts"]
    assert fp8["status"] == "pass" and fp8["outputs"]["fp8_check.json"]["ok"] is True
    assert drift["status"] == "pass" and drift["smoke"] and "batch invariance: PASS" in drift["log_tail"]
    result = drift["outputs"]["batch_invariance_smoke.json"]
    assert result["identical_tokens"] is True and result["promise_kept"] is True
    assert "===== part 6" in (tmp_path / "gpu_check.log").read_text()


def test_smoke_with_a_cold_cpu_kernel_cache_builds_nothing(tmp_path):
    """The check never builds the C++ CPU kernels (collecting test_window_attention.py would): a cold
    cache stays empty through the kernel-test part."""
    cache = tmp_path / "cache"
    run = _script("--smoke", "--part", "1", out=tmp_path / "out", BYZANTIUM_CACHE=str(cache))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert "building the CPU kernels" not in log and "TestTritonFp8Moe" in log and "TestTritonFp8" in log
    assert not (cache / "ext").exists()


def test_a_part_past_its_stop_is_ended_and_recorded(tmp_path):
    parts = _gpu_parts()
    slow = (9, "sleeps", 1, [sys.executable, "-c", "import time; time.sleep(60)"], None)
    assert parts.run_part(slow, str(tmp_path), smoke=False) is False
    record = json.loads((tmp_path / "gpu_check.json").read_text())["parts"][-1]
    assert record["status"] == "timeout" and record["seconds"] < 20
    assert "part 9: sleeps (timeout" in (tmp_path / "gpu_check.log").read_text()
