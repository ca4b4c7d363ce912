"""Runs on Ray (backends/ray_engines.py, the runner's placement): on a local Ray instance started here
(CPU only), the embedded model on two replicas, RRMaj and SAC write the same rows as in one process; a
replica killed mid-run loses nothing (its instance runs again, counted); a Ray run resumes.

The replicas are loaded once for the module (a shared pool); the CLI test starts its own. The first
test (the runner's rescheduling, on a fake placement) needs no Ray."""
import asyncio
import contextvars
import importlib.util
import json
import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from byzantium.backends import PLACEMENT, LLMPool, SamplingParams
from byzantium.cli import main
from byzantium.experiments.rr import run_rr_experiment
from byzantium.experiments.runner import read_results, run_instances
from byzantium.experiments.sac import run_experiment
from byzantium.tasks import get_task

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed (pip install 'byzantium[ray]')")

MODEL = "smollm2-135m"
RR = dict(corrupt=1, k=8, m=2, max_len=24, n=3, seed=0, progress=False, table=False)  # = the CLI flags below
RR_FLAGS = ["--agents", "3", "--corrupt", "1", "--chunk", "8", "--trajectories", "2", "--max-len", "24",
            "--task", "gen-track", "--seed", "0", "--device", "cpu", "--no-progress"]
# Scores written by the judge (generate mode): tokens are batch-independent, so rows match to the byte.
# (Logprob scores are floats whose last digits follow the batch's make-up, in one process too.)
SAC = dict(n=4, weak=0, byzantine=1, F=1, T=1, topology="complete", score_mode="generate", seed=0,
           solve_params=SamplingParams(max_tokens=16, temperature=0.1),
           judge_params=SamplingParams(max_tokens=12, temperature=0.1), progress=False, table=False)


class FakePlacement:
    """Two replicas; what the runner asks of a placement (ray_placement.Placement), and nothing else."""
    name = "ray"

    def __init__(self):
        self.current = contextvars.ContextVar("binding", default=None)
        self.replicas = [SimpleNamespace(id=f"r{i}", alive=True, instances=0, node="n", ip="i",
                                         llm=SimpleNamespace(name="m")) for i in range(2)]

    async def acquire(self, limit):
        while True:
            free = [r for r in self.replicas if r.alive and r.instances < limit]
            if free:
                r = min(free, key=lambda r: r.instances)
                r.instances += 1
                return FakeBinding(self, r)
            await asyncio.sleep(0.01)

    def release(self, binding):
        binding.replica.instances -= 1

    def tokens(self):
        return {r.id: 0 for r in self.replicas}

    def replica_list(self):
        return self.replicas


class FakeBinding:
    def __init__(self, placement, replica):
        self.placement, self.replica, self.replicas, self.lost = placement, replica, {"m": replica}, False

    @contextmanager
    def active(self):
        token = self.placement.current.set(self)
        try:
            yield self
        finally:
            self.placement.current.reset(token)


def test_an_instance_whose_replica_died_runs_again_even_when_the_error_was_swallowed(tmp_path):
    placement = FakePlacement()

    async def solve(item):
        binding = placement.current.get()
        await asyncio.sleep(0.01)
        if item != 0 and binding.replica.id == "r0":  # r0 dies under its second instance; the protocol swallows it
            binding.replica.alive, binding.lost = False, True
            return {"answer": "a failed score, counted as 0"}
        return {"answer": item * 10}

    run_instances(list(range(4)), solve, tmp_path, key=str, concurrency=1, placement=placement, progress=False)
    assert sorted((r["id"], r["answer"]) for r in read_results(tmp_path)) == [("0", 0), ("1", 10), ("2", 20),
                                                                              ("3", 30)]
    report = json.loads((tmp_path / "summary.json").read_text())["ray"]
    assert report["retried_instances"] == 1
    assert {r["id"]: r["instances"] for r in report["replicas"]} == {"r0": 1, "r1": 3}  # r0 took no more


@pytest.fixture(scope="module")
def cluster(smollm2_dir):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'byzantium[ray]')")
    # 4 logical CPUs on the 2 cores: the shared pool's two replicas, and room for the CLI's own pool
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_pool(cluster):
    pool = LLMPool("native", device="cpu", ray=True, ray_replicas=2)
    pool.get(MODEL)  # both replicas loaded here, once
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def local_pool(smollm2_dir):
    with LLMPool("native", device="cpu") as pool:
        yield pool


@contextmanager
def on(pool):
    """Runs inside bind their instances to the pool's replicas (what `with pool:` does, pool kept open)."""
    token = PLACEMENT.set(pool.placement)
    try:
        yield
    finally:
        PLACEMENT.reset(token)


def rows(out):
    return sorted((out / "results.jsonl").read_text().splitlines())


def summary(out):
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def rr_reference(local_pool, tmp_path_factory):
    """RRMaj on 4 questions in one process: the rows every Ray run must reproduce."""
    out = tmp_path_factory.mktemp("rr-one")
    run_rr_experiment("rrmaj", get_task("gen-track", 4, 0), local_pool.get(MODEL), out=str(out), **RR)
    return out


def test_rrmaj_on_two_replicas_writes_the_same_rows(ray_pool, rr_reference, tmp_path):
    with on(ray_pool):
        run_rr_experiment("rrmaj", get_task("gen-track", 4, 0), ray_pool.get(MODEL), out=str(tmp_path),
                          concurrency=1, **RR)
    assert rows(tmp_path) == rows(rr_reference)  # byte-identical, order aside
    report = summary(tmp_path)["ray"]
    assert report["retried_instances"] == 0
    ran = {r["id"]: r["instances"] for r in report["replicas"]}
    assert sum(ran.values()) == 4 and all(ran.values())  # one in flight per replica: both worked
    assert all(r["model"] == MODEL and r["node"] for r in report["replicas"])
    engine = summary(tmp_path)["engine"]
    assert engine["decode_tokens"] > 0 and engine["engines"][MODEL]["backend"] == "ray"


def test_sac_on_two_replicas_writes_the_same_rows(ray_pool, local_pool, tmp_path):
    tasks = get_task("gen-arith", 3, 0)
    run_experiment("sac", tasks, local_pool.get(MODEL), out=str(tmp_path / "one"), **SAC)
    with on(ray_pool):
        run_experiment("sac", tasks, ray_pool.get(MODEL), out=str(tmp_path / "ray"), concurrency=1, **SAC)
    assert len(rows(tmp_path / "ray")) == 3
    assert rows(tmp_path / "ray") == rows(tmp_path / "one")
    assert summary(tmp_path / "ray")["errors"] == 0


def test_logprob_scoring_and_calls_outside_a_run(ray_pool, local_pool):
    """A call outside any run goes to the least busy replica; logprobs come back as the engine's."""
    import asyncio
    prompt = [{"role": "user", "content": "Is 2 + 2 = 4? Answer Yes or No."}]
    remote = asyncio.run(ray_pool.get(MODEL).score(prompt, ["Yes", "No"]))
    local = asyncio.run(local_pool.get(MODEL).score(prompt, ["Yes", "No"]))
    assert remote == pytest.approx(local, abs=1e-4)


def test_the_cli_runs_on_ray_and_resumes(cluster, rr_reference, tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["run", "rrmaj", *RR_FLAGS, "--out", str(out), "--ray", "--ray-replicas", "2"]
    assert main([*argv, "--limit", "2"]) == 0  # a run cut short ...
    assert len(rows(out)) == 2
    assert main([*argv, "--limit", "4"]) == 0  # ... resumes: only the two missing questions run
    assert rows(out) == rows(rr_reference)
    s = summary(out)
    assert s["complete"] and s["instances"] == 4
    assert sum(r["instances"] for r in s["ray"]["replicas"]) == 2
    import ray
    assert ray.is_initialized()  # the CLI's pool joined this Ray instance and left it running


@needs_ray
@pytest.mark.parametrize("argv, problem", [
    (["--ray-replicas", "2"], "--ray-replicas is for --ray"),
    (["--ray", "--ray-replicas", "0"], "--ray-replicas must be >= 1"),
    (["--ray", "--ray-gpus-per-replica", "2"], "--ray-gpus-per-replica"),
    (["--ray", "--backend", "openai", "--base-url", "http://127.0.0.1:9"], "--backend native"),
])
def test_bad_ray_flags_are_refused_before_anything_starts(argv, problem, tmp_path, capsys, monkeypatch):
    import byzantium.backends

    def refuse(*args, **kwargs):
        raise AssertionError("a pool was built for a refused command")
    monkeypatch.setattr(byzantium.backends, "LLMPool", refuse)
    assert main(["run", "rrmaj", "--out", str(tmp_path / "o"), *argv]) == 2
    assert problem in capsys.readouterr().err


def test_a_killed_replica_loses_nothing(ray_pool, rr_reference, tmp_path):
    """Last: it kills a replica of the shared pool (which starts it again)."""
    import ray
    llm = ray_pool.get(MODEL)
    victim = llm.replicas[0]
    tokens, killed = victim.tokens, threading.Event()

    def kill_mid_instance():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if victim.instances and victim.tokens > tokens + 8:  # inside an instance, some turns in
                ray.kill(victim.actor)
                killed.set()
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_mid_instance, daemon=True)
    killer.start()
    with on(ray_pool):
        run_rr_experiment("rrmaj", get_task("gen-track", 4, 0), llm, out=str(tmp_path), concurrency=1, **RR)
    killer.join(timeout=5)
    assert killed.is_set()
    s = summary(tmp_path)
    assert s["complete"] and s["errors"] == 0 and s["instances"] == 4
    assert rows(tmp_path) == rows(rr_reference)  # the retried instance wrote what it would have anyway
    report = s["ray"]
    assert report["retried_instances"] >= 1
    dead = next(r for r in report["replicas"] if r["id"] == victim.id)
    assert not dead["alive"]
    assert sum(r["instances"] for r in report["replicas"]) == 4  # each instance counted where it finished
    assert any(r.id.endswith("/r1") for r in llm.replicas)  # its slot was started again
