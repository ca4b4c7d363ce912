"""Tensor parallelism on the CPU (gloo, 2 ranks): the split model gives what the whole one gives, token for
token at fp32, on tiny random Llama, Qwen3, Qwen3-MoE and Gemma 3 models (greedy, seeded sampling, sessions
with append prefill, batched scoring, riders); a rank killed mid-step fails the engine quickly with an error
naming the rank; bad sizes fail before any process starts.

Both engines run the linears on plain torch (cpu_packed_linears=False): the kernel measured fastest for a
whole weight and for its half may differ, and two kernels round differently. What is compared is the split
itself."""
import importlib.util
import os
import threading
import time

import pytest
import torch

from byzantium.engine.engine import Engine
from byzantium.engine.failures import EngineFailed
from byzantium.engine.sampling import SamplingParams
from conftest import build_tiny, random_prompts, reordered_sums_tolerance
from test_gemma3 import build as build_gemma3
from test_moe import build_tiny_moe

COMMON = dict(device="cpu", dtype="float32", num_blocks=128, cpu_packed_linears=False)
PROMPTS = random_prompts([5, 23, 40, 9], seed=11)


def build(kind):
    if kind == "llama":
        return build_tiny("llama")
    if kind == "qwen3":
        return build_tiny("qwen3", attention_bias=True)
    if kind == "llama-one-kv-head":  # more ranks than K/V heads: each rank keeps the one it reads
        return build_tiny("llama", num_key_value_heads=1)
    if kind == "qwen3-moe":
        return build_tiny_moe(num_hidden_layers=3, norm_topk_prob=True, mlp_only_layers=[1])
    if kind == "gemma3":
        return build_gemma3("window8")
    raise ValueError(kind)


def outputs(engine):
    """Everything compared between the whole and the split model, from one engine."""
    out = {"greedy": [o.token_ids for o in engine.generate(PROMPTS, SamplingParams(max_tokens=10))]}
    sampled = [SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=s) for s in range(len(PROMPTS))]
    out["sampled"] = [o.token_ids for o in engine.generate(PROMPTS, sampled)]
    # the same prompt three times: the followers ride on the leader's rows, then part ways (a KV block copy)
    riders = [SamplingParams(max_tokens=8, temperature=1.0, seed=s) for s in (1, 2, 3)]
    out["riders"] = [o.token_ids for o in engine.generate([PROMPTS[1]] * 3, riders)]
    out["logits"] = engine.logits(PROMPTS)
    out["scores"] = engine.score(PROMPTS, [[3, 17, 42]] * len(PROMPTS))
    session = engine.open_session(PROMPTS[0])
    turns = []
    for turn in range(3):  # round-robin style: generate, append another agent's tokens, generate again
        turns.append(engine.continue_([session], SamplingParams(max_tokens=4))[0].token_ids)
        engine.extend(session, PROMPTS[3][turn:turn + 3])
    engine.close_session(session)
    out["session"] = turns
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {}


def checkpoint(checkpoints, tmp_path_factory, kind):
    if kind not in checkpoints:
        path = tmp_path_factory.mktemp(kind)
        build(kind).save_pretrained(path)
        checkpoints[kind] = path
    return checkpoints[kind]


@pytest.mark.parametrize("kind", ["llama", "qwen3", "llama-one-kv-head", "qwen3-moe", "gemma3"])
def test_two_ranks_equal_one(kind, checkpoints, tmp_path_factory):
    path = checkpoint(checkpoints, tmp_path_factory, kind)
    one = Engine(path, **COMMON)
    whole, layers = outputs(one), one.config.num_hidden_layers
    engine = Engine(path, tensor_parallel_size=2, **COMMON)
    try:
        assert engine.describe()["tensor_parallel_size"] == 2
        assert engine.model.num_kv_heads == 1  # this rank's share of 2 (or the one replicated)
        split = outputs(engine)
    finally:
        engine.close()
    for key in ("greedy", "sampled", "riders", "session"):
        assert split[key] == whole[key], key
    torch.testing.assert_close(split["logits"], whole["logits"],  # summed in two halves
                               **reordered_sums_tolerance(whole["logits"], layers))
    for a, b in zip(split["scores"], whole["scores"]):
        assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 for k in a)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism on CUDA (NCCL) needs two GPUs")
@pytest.mark.parametrize("kind", ["llama", "qwen3-moe", "gemma3"])
def test_two_gpus_equal_one(kind, checkpoints, tmp_path_factory):
    """The same on NCCL: rank r on cuda:r, fp32 (the comparison is of the split, not of a dtype)."""
    path = checkpoint(checkpoints, tmp_path_factory, kind)
    on_gpu = dict(device="cuda", dtype="float32", num_blocks=128, enforce_eager=True)
    whole = Engine(path, **on_gpu)
    want = [o.token_ids for o in whole.generate(PROMPTS, SamplingParams(max_tokens=10))]
    want_logits = whole.logits(PROMPTS)
    del whole
    engine = Engine(path, tensor_parallel_size=2, **on_gpu)
    try:
        assert [o.token_ids for o in engine.generate(PROMPTS, SamplingParams(max_tokens=10))] == want
        torch.testing.assert_close(engine.logits(PROMPTS), want_logits, rtol=1e-4, atol=1e-4)
    finally:
        engine.close()


def test_a_killed_rank_fails_the_engine_quickly(checkpoints, tmp_path_factory):
    path = checkpoint(checkpoints, tmp_path_factory, "llama")
    engine = Engine(path, tensor_parallel_size=2, **COMMON)
    try:
        result = {}

        def generate():
            try:
                result["outputs"] = engine.generate(PROMPTS * 4, SamplingParams(max_tokens=400, ignore_eos=True))
            except Exception as error:  # noqa: BLE001 - what the caller sees
                result["error"] = error

        worker = threading.Thread(target=generate)
        worker.start()
        deadline = time.monotonic() + 60
        while engine.step_records.totals["decode_tokens"] == 0 and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)  # until it decodes: mid-generation, however fast or slow this machine is
        assert worker.is_alive(), "the generation ended before the rank was killed: make it longer"
        killed = time.monotonic()
        engine.peers.workers[1].kill()
        worker.join(timeout=30)
        assert not worker.is_alive(), "the engine hung after a rank died"
        assert time.monotonic() - killed < 15
        error = result.get("error")
        assert isinstance(error, EngineFailed), result
        assert "rank 1" in str(error) and "signal 9" in str(error)
        with pytest.raises(EngineFailed, match="rank 1"):  # and every later request
            engine.generate(PROMPTS[:1], SamplingParams(max_tokens=2))
    finally:
        engine.close()


def test_a_dead_rank_between_steps_aborts_the_group_as_on_nccl(checkpoints, tmp_path_factory):
    """The NCCL path of the watchdog, on gloo: a rank that dies between steps sets the failure and aborts
    the group (on NCCL, what frees rank 0 from a collective that would wait for the dead rank). Left to a
    GPU: that NCCL's abort from the watchdog thread really ends a rank-0 collective blocked in .tolist()."""
    path = checkpoint(checkpoints, tmp_path_factory, "llama")
    engine = Engine(path, tensor_parallel_size=2, **COMMON)
    try:
        aborted = threading.Event()
        peers, real_backend = engine.peers, engine.peers.group.backend
        peers.nccl = True
        peers.group.backend = type("AbortRecorder", (), {"abort": lambda self: aborted.set(),
                                                         "__getattr__": lambda self, n: getattr(real_backend, n)})()
        peers.workers[1].kill()
        assert aborted.wait(timeout=15), "the watchdog did not abort the group"
        assert "rank 1" in peers.failure and "signal 9" in peers.failure
        with pytest.raises(EngineFailed, match="rank 1"):
            engine.generate(PROMPTS[:1], SamplingParams(max_tokens=2))
    finally:
        engine.close()


def test_an_engine_left_open_at_exit_ends_quietly(checkpoints, tmp_path_factory, tmp_path):
    """A script that never closes its TP=2 engine: its ranks are told to exit at interpreter exit, so it
    exits 0 and says nothing of killed ranks or aborts."""
    import os
    import subprocess
    import sys
    path = checkpoint(checkpoints, tmp_path_factory, "llama")
    script = tmp_path / "left_open.py"
    script.write_text(
        "import sys\n"
        "from byzantium import Engine, SamplingParams\n"
        "if __name__ == '__main__':\n"
        f"    engine = Engine(sys.argv[1], tensor_parallel_size=2, **{COMMON!r})\n"
        "    print('tokens', engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4))[0].token_ids)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "tokens" in run.stdout
    for alarming in ("terminate called", "killed", "ended", "Traceback", "abort"):
        assert alarming not in run.stderr, run.stderr[-3000:]


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_fp8_quantized_at_load_two_ranks_equal_one(kind, checkpoints, tmp_path_factory):
    """Each rank quantizes its slice of a row-parallel weight with the whole rows' scales: the FP8 model
    split in two is the FP8 model."""
    path = checkpoint(checkpoints, tmp_path_factory, kind)
    whole = Engine(path, quantization="fp8", **COMMON)
    assert whole.describe()["quantization"] == "fp8"
    assert whole.describe()["quantization_source"] == "quantized at load"
    want = [o.token_ids for o in whole.generate(PROMPTS, SamplingParams(max_tokens=10))]
    engine = Engine(path, tensor_parallel_size=2, quantization="fp8", **COMMON)
    try:
        assert [o.token_ids for o in engine.generate(PROMPTS, SamplingParams(max_tokens=10))] == want
        want_logits = whole.logits(PROMPTS)
        torch.testing.assert_close(engine.logits(PROMPTS), want_logits,
                                   **reordered_sums_tolerance(want_logits, whole.config.num_hidden_layers))
    finally:
        engine.close()


def test_two_tensor_parallel_engines_share_a_process(checkpoints, tmp_path_factory):
    """Each engine has its own process groups (not torch.distributed's global one): two at once, as a
    heterogeneous ensemble holds them, each answering as its whole model does."""
    paths = [checkpoint(checkpoints, tmp_path_factory, kind) for kind in ("llama", "qwen3")]
    params = SamplingParams(max_tokens=6)
    want = [[o.token_ids for o in Engine(path, **COMMON).generate(PROMPTS, params)] for path in paths]
    engines = [Engine(path, tensor_parallel_size=2, **COMMON) for path in paths]
    try:
        for _ in range(2):  # interleaved
            assert [[o.token_ids for o in e.generate(PROMPTS, params)] for e in engines] == want
    finally:
        for engine in engines:
            engine.close()
    assert not torch.distributed.is_initialized()


def resident_bytes(pid, address):
    """Resident bytes of the mapping of process `pid` that starts at `address` (Linux: /proc/pid/smaps)."""
    lines = open(f"/proc/{pid}/smaps").read().splitlines()
    for i, line in enumerate(lines):
        if "-" in line.split()[0] and int(line.split("-")[0], 16) == address:
            for entry in lines[i + 1:]:
                if entry.startswith("Rss:"):
                    return int(entry.split()[1]) * 1024
    raise AssertionError(f"no mapping at {address:#x} in process {pid}")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads a rank's mappings from /proc (Linux)")
def test_every_rank_reserves_its_kv_pool_at_start(checkpoints, tmp_path_factory):
    """A KV budget the user set (kv_cache_gib) is reserved at start on every rank, not only on rank 0: each
    rank's slice of the pool has the planned block count and is resident before any request runs."""
    path = checkpoint(checkpoints, tmp_path_factory, "llama")
    options = dict(COMMON, num_blocks=None, kv_cache_gib=0.0625, max_num_seqs=512)  # more blocks than the budget
    engine = Engine(path, tensor_parallel_size=2, **options)
    try:
        pools = engine.peers.ask("kv_cache")
        assert list(pools) == [1]
        pool = pools[1]
        assert pool["num_blocks"] == engine.num_blocks and pool["bytes"] == engine.kv_cache.numel() * 4
        assert pool["bytes"] > 2**25  # large enough that resident pages cannot be there by chance
        assert resident_bytes(engine.peers.workers[1].pid, pool["address"]) >= pool["bytes"]
    finally:
        engine.close()


def test_a_rank_that_cannot_load_fails_the_engine_start(checkpoints, tmp_path_factory, tmp_path, monkeypatch):
    """Rank 0 loads, then its weights vanish before the other rank reads them: the engine's start ends
    with an error naming that rank (its traceback on stderr), not a wait for the collectives' timeout."""
    import shutil

    from byzantium.engine import tensor_parallel
    path = tmp_path / "model"
    shutil.copytree(checkpoint(checkpoints, tmp_path_factory, "llama"), path)
    start = tensor_parallel.Peers.__init__

    def weights_gone(self, *args):
        for file in path.glob("*.safetensors"):
            file.unlink()
        start(self, *args)

    monkeypatch.setattr(tensor_parallel.Peers, "__init__", weights_gone)
    began = time.monotonic()
    with pytest.raises(EngineFailed, match="rank 1.*exit code 1"):
        Engine(path, tensor_parallel_size=2, **COMMON)
    assert time.monotonic() - began < 60


def test_sizes_that_do_not_split_fail_before_any_rank_starts(checkpoints, tmp_path_factory):
    path = checkpoint(checkpoints, tmp_path_factory, "llama")  # 4 attention heads
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide the attention heads"):
        Engine(path, tensor_parallel_size=3, **COMMON)
    assert not torch.distributed.is_initialized()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'byzantium[ray]')")
def test_a_ray_replica_is_one_tensor_parallel_group(checkpoints, tmp_path_factory):
    """With --ray a replica is one actor holding its group's resources (Ray places it on one node), its
    ranks processes of that actor; it answers as the whole model does in this process."""
    import asyncio

    import ray

    from byzantium.backends import LLMPool
    path = str(checkpoint(checkpoints, tmp_path_factory, "llama"))
    params = SamplingParams(max_tokens=8)
    with LLMPool("native", **COMMON) as pool:
        want = asyncio.run(pool.get(path).generate(PROMPTS[1], params)).token_ids
    ray.init(num_cpus=2, logging_level="ERROR", include_dashboard=False)
    try:
        with LLMPool("native", ray=True, ray_replicas=1, tensor_parallel_size=2, **COMMON) as pool:
            llm = pool.get(path)
            assert asyncio.run(llm.generate(PROMPTS[1], params)).token_ids == want
            assert llm.describe()["tensor_parallel_size"] == 2
            assert pool.placement.resources(2) == (2, 0)  # CPU: two CPUs, no GPU, for the two ranks
    finally:
        ray.shutdown()


def test_the_flags_reach_the_engine_options():
    import argparse

    from byzantium.backends import add_backend_args, pool_kwargs
    parser = argparse.ArgumentParser()
    add_backend_args(parser)
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    args = parser.parse_args(["--tensor-parallel-size", "4", "--quantization", "fp8", "--kv-cache-dtype", "fp8"])
    assert pool_kwargs(args) == {"tensor_parallel_size": 4, "quantization": "fp8", "kv_cache_dtype": "fp8"}
    with pytest.raises(ValueError, match="--tensor-parallel-size must be >= 1"):
        pool_kwargs(parser.parse_args(["--tensor-parallel-size", "0"]))
    with pytest.raises(ValueError, match="are for --backend native, not hf"):
        pool_kwargs(parser.parse_args(["--backend", "hf", "--tensor-parallel-size", "2"]))
    with pytest.raises(ValueError, match="is for --backend native"):
        pool_kwargs(parser.parse_args(["--backend", "openai", "--base-url", "http://x", "--quantization", "fp8"]))
