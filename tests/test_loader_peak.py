"""Loading a sharded checkpoint at bf16 holds at most the bf16 weights plus one tensor (and one shard's
file pages) beyond what the process held before: weights are allocated once, at the target dtype, and
read one tensor at a time."""
import json
import subprocess
import sys

import torch

MEASURE = r"""
import json, resource, sys, torch
from byzantium import Engine
torch.ones(1) + 1  # torch's own start-up allocations before the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
engine = Engine(sys.argv[1], dtype="bfloat16", num_blocks=4, max_num_seqs=1)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak_growth": after - before, "weights": engine.memory["weights_bytes"]}))
"""


def test_peak_memory_while_loading_shards_at_bf16(tmp_path):
    import transformers
    config = transformers.LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)  # ~35M parameters: 140 MB in fp32, 70 MB in bf16
    model.save_pretrained(tmp_path, max_shard_size="40MB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) >= 3
    largest_tensor = max(p.numel() * 4 for p in model.parameters())
    largest_shard = max(f.stat().st_size for f in shards)
    fp32_bytes = sum(p.numel() * 4 for p in model.parameters())
    del model
    out = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path)], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    bound = result["weights"] + largest_tensor + largest_shard + 32 * 2**20  # + allocator and import slack
    assert result["weights"] < 0.55 * fp32_bytes  # bf16, not fp32
    assert result["peak_growth"] <= bound, (
        f"loading grew the peak by {result['peak_growth'] / 2**20:.0f} MiB; bound {bound / 2**20:.0f} MiB "
        f"(bf16 weights {result['weights'] / 2**20:.0f} MiB, fp32 weights {fp32_bytes / 2**20:.0f} MiB)")


def test_weights_are_allocated_at_the_target_dtype(tiny_llama, monkeypatch):
    """On CPU an fp32 copy made and dropped may never show in resident memory (untouched pages), so the
    allocation itself is watched: to_empty must already see bf16 parameters."""
    from byzantium import Engine
    allocated = []
    original = torch.nn.Module.to_empty

    def to_empty(module, *args, **kwargs):
        result = original(module, *args, **kwargs)
        allocated.extend(p.dtype for p in result.parameters())
        return result

    monkeypatch.setattr(torch.nn.Module, "to_empty", to_empty)
    engine = Engine(tiny_llama[1], dtype="bfloat16", num_blocks=8)
    assert allocated and set(allocated) == {torch.bfloat16}
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
