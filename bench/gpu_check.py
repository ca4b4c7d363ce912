"""GPU check: kernel tests on CUDA, attention microbenchmarks, engine decode throughput.

Run by bench/gpu_check.sh as its part 2 (from the repository root, PYTHONPATH=.). No network, nothing installed:
the model is a random-initialised Qwen3-0.6B-shaped model written to a temporary directory (no
tokenizer: prompts are token ids). Writes a markdown report to $OUT/gpu_check.md (or
bench/results/gpu_check.md when $OUT is unset), rewritten after every section so a timeout keeps what
finished, and prints it last.

    PYTHONPATH=. python bench/gpu_check.py            # the real thing, CUDA
    PYTHONPATH=. python bench/gpu_check.py --smoke    # CPU, tiny model and shapes: checks the script
"""
import argparse
import inspect
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_bench  # noqa: E402  (bench/ is not a package)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                 rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
            tie_word_embeddings=True)


class Report:
    """Markdown sections, written to disk after each one."""

    def __init__(self, path):
        self.path, self.sections = path, []

    def add(self, text):
        self.sections.append(text.rstrip() + "\n")
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "w") as f:
            f.write("\n".join(self.sections))

    def section(self, title, fn):
        start = time.perf_counter()
        try:
            body = fn()
        except Exception:  # keep going: the other sections are still worth having
            body = "FAILED:\n\n```\n" + traceback.format_exc()[-3000:] + "```\n"
        self.add(f"## {title} ({time.perf_counter() - start:.0f} s)\n\n{body}")


def environment(device):
    import transformers
    lines = [f"- torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}"]
    try:
        import triton
        lines.append(f"- triton {triton.__version__}")
    except ImportError:
        lines.append("- triton: not installed")
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        lines.append(f"- GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, "
                     f"CUDA {torch.version.cuda}")
    else:
        lines.append("- CPU only (smoke mode: the numbers mean nothing)")
    return "\n".join(lines) + "\n"


def kernel_tests(timeout):
    """tests/test_kernels.py in its own process. On CUDA it runs the Triton kernels in process; the fp32
    cases are left out (bf16 and fp16 are what the GPU path runs; every kernel variant costs a compile),
    the fp32 tile-size, GQA-3 and engine cases stay in."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_kernels.py", "-k", "not fp32"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    try:
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"TIMED OUT after {timeout} s\n"
    lines = run.stdout.strip().splitlines()
    verdict = "PASSED" if run.returncode == 0 else f"FAILED (exit {run.returncode})"
    body = f"`{' '.join(cmd[2:])}`: **{verdict}** — {lines[-1] if lines else 'no output'}\n"
    if run.returncode != 0:
        body += "\n```\n" + run.stdout[-4000:] + run.stderr[-2000:] + "\n```\n"
    return body


# ----------------------------------------------------------------------------------------- engine

def make_model(shape, directory, device, dtype):
    """A random Qwen3 model of the given shape, saved (safetensors, no tokenizer) into `directory`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)
    config = Qwen3Config(**shape)
    with torch.device(device):  # initialise on the GPU: seconds instead of a minute on the CPU
        model = Qwen3ForCausalLM(config)
    model = model.to(dtype).eval()
    model.save_pretrained(directory)
    return model


def _accepted(fn, kwargs):
    """The kwargs that fn's signature takes (the engine's constructor is young: tolerate churn)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def engine_decode(engine, prompts, gen, device):
    """(decode tokens/s from the engine's own step records, end-to-end generated tokens/s)."""
    from byzantium import SamplingParams
    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)
    before = dict(engine.stats)
    _sync(device)
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    _sync(device)
    wall = time.perf_counter() - start
    after = engine.stats
    assert all(len(o.token_ids) == gen for o in outs), "ignore_eos=True should give exactly max_tokens tokens"
    tokens = after["decode_tokens"] - before.get("decode_tokens", 0)
    seconds = after["decode_seconds"] - before.get("decode_seconds", 0.0)
    return (tokens / seconds if seconds else float("nan")), len(prompts) * gen / wall


def hf_decode(model, prompts, gen, device):
    """transformers generate (greedy, its default dynamic cache): decode tokens/s, taken as the time of
    `gen` new tokens minus the time of 1 new token (the prefill), and end-to-end tokens/s."""
    ids = torch.tensor(prompts, device=device)
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)

    def timed(n):
        _sync(device)
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
        _sync(device)
        assert out.shape[1] == ids.shape[1] + n
        return time.perf_counter() - start

    with torch.inference_mode():
        prefill = timed(1)
        full = timed(gen)
    return len(prompts) * (gen - 1) / max(full - prefill, 1e-9), len(prompts) * gen / full


def engine_section(device, dtype, shape, batches, prompt_len, gen, backend, copy_gbps):
    from byzantium import Engine
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        model = make_model(shape, directory, device, dtype)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: counted once
        num_blocks = max(batches) * -(-(prompt_len + gen) // 16) * 2 + 16  # two runs' worth (warm-up, timed)
        base = dict(model=directory, device=str(device), dtype=dtype, attention_backend=backend, block_size=16,
                    num_blocks=num_blocks, max_num_seqs=max(batches), max_batch_tokens=max(8192, max(batches)),
                    max_model_len=prompt_len + gen + 16)
        # Decode with and without CUDA graphs (enforce_eager=True turns them off; CPU engines are eager).
        variants = [("eager", {"enforce_eager": True})]
        if device.type == "cuda":
            variants.append(("cuda graphs", {"enforce_eager": False}))
        gen_rng = torch.Generator().manual_seed(0)
        for label, extra in variants:
            engine = Engine(**_accepted(Engine, {**base, **extra}))
            for batch in batches:
                def prompts():  # fresh random ids each run: no prefix-cache hits between runs
                    return torch.randint(0, shape["vocab_size"], (batch, prompt_len), generator=gen_rng).tolist()
                engine_decode(engine, prompts(), gen, device)  # warm-up: Triton compiles, allocator
                decode, e2e = engine_decode(engine, prompts(), gen, device)
                row = {"engine": f"{backend}, {label}", "batch": batch, "engine decode tok/s": decode,
                       "engine e2e tok/s": e2e}
                if batch == 1:
                    bound = copy_gbps * 1e9 / weight_bytes if copy_gbps else None
                    row["weights-read bound tok/s"] = bound
                    row["% of bound"] = 100 * decode / bound if bound else None
                rows.append(row)
            del engine
            if device.type == "cuda":
                torch.cuda.empty_cache()
        hf = {}
        for batch in batches:
            prompts = torch.randint(0, shape["vocab_size"], (batch, prompt_len), generator=gen_rng).tolist()
            hf_decode(model, prompts, 4, device)  # warm-up
            hf[batch] = hf_decode(model, prompts, gen, device)
        for row in rows:
            row["HF generate decode tok/s"], row["HF e2e tok/s"] = hf[row["batch"]]
            row["decode speedup"] = row["engine decode tok/s"] / row["HF generate decode tok/s"]
    note = (f"Random Qwen3 model ({shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
            f"{weight_bytes / 1e9:.2f} GB of weights in {kernel_bench.dtype_name(dtype)}), prompts of {prompt_len} "
            f"random token ids, {gen} greedy tokens each (ignore_eos). Engine decode tok/s: decode tokens / time of "
            f"pure decode steps (Engine.stats); HF: (time of {gen} tokens - time of 1) per token. "
            f"Weights-read bound: copy bandwidth / weight bytes (batch 1 reads every weight once a token); "
            f"far below it means decode is launch-bound (CUDA graphs are the fix).\n\n")
    return note + kernel_bench.markdown(rows)


# ------------------------------------------------------------------------------------------- main

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model and shapes (checks the script)")
    parser.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "results"))
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--test-timeout", type=int, default=170)
    args = parser.parse_args()

    if args.smoke:
        device, dtype, shape, batches, prompt_len, gen = torch.device("cpu"), torch.float32, TINY, (1, 4), 8, 4
        backend = "triton" if os.environ.get("TRITON_INTERPRET") == "1" else "torch"
        kernel_backends = (backend,)
    else:
        if not torch.cuda.is_available():
            sys.exit("gpu_check: torch sees no CUDA device (use --smoke for a CPU check of this script)")
        device, dtype, shape, batches, prompt_len, gen = torch.device("cuda"), torch.bfloat16, QWEN3_06B, (1, 64, 256), 128, 128
        backend, kernel_backends = "triton", ("triton", "torch")

    report = Report(os.path.join(args.out, "gpu_check_smoke.md" if args.smoke else "gpu_check.md"))
    report.add(f"# Byzantium GPU check ({time.strftime('%Y-%m-%d %H:%M')})\n\n" + environment(device))
    if not args.skip_tests:
        report.section("Kernel tests (tests/test_kernels.py)", lambda: kernel_tests(args.test_timeout))

    copy = {}

    def kernels():
        sections, copy["gbps"] = kernel_bench.run(device, dtype, smoke=args.smoke, backends=kernel_backends)
        return "\n".join(sections)

    report.section("Attention kernels", kernels)
    report.section("Engine decode throughput vs transformers generate",
                   lambda: engine_section(device, dtype, shape, batches, prompt_len, gen, backend, copy.get("gbps")))
    print("\n".join(report.sections))
    print(f"(written to {report.path})")


if __name__ == "__main__":
    main()
