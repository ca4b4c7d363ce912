"""`byzantium plan`: the arithmetic on a small config by hand, parameter counts of the built-in table
against the published totals, config.json parsing (multimodal, MoE, FP8 checkpoints), the choice of
TP size and quantization, and the command through the real entry point, errors included."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from byzantium.cli import main
from byzantium.engine.memory import rank_weight_bytes
from byzantium.plan import command as plan_command
from byzantium.plan.facts import BUILTIN, builtin, from_config, model_facts
from byzantium.plan.fit import (GIB, H200_GIB, kv_bytes_per_token, option, params, plan_model, rank_params, tp_sizes,
                                weight_bytes)

ROOT = Path(__file__).resolve().parents[1]

# A small decoder: hidden 1024, 4 layers, 8 query heads and 2 K/V heads of 128, an MLP of 4096, a
# vocabulary of 1000, the LM head apart from the embedding.
SMALL = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 4096, "vocab_size": 1000,
         "tie_word_embeddings": False, "max_position_embeddings": 2048}


def test_the_arithmetic_by_hand():
    f = from_config("small", SMALL)
    # One rank: q/k/v 1024 x 128 x (8 + 2 + 2), o 8 x 128 x 1024, gate/up/down 3 x 1024 x 4096, per layer.
    per_layer = 1024 * 128 * 12 + 1024 * 1024 + 3 * 1024 * 4096
    assert per_layer == 15_204_352
    # Output rows (one FP8 scale each): q/k/v 12 x 128, o 1024, gate/up 2 x 4096, down 1024.
    # Kept in bf16: two norms a layer, the embedding and LM head (1000 x 1024 each), the final norm.
    assert rank_params(f) == {"linear": 4 * 15_204_352, "rows": 4 * 11_776, "experts": 0, "expert_rows": 0,
                              "kept": 4 * 2048 + 2_048_000 + 1024}
    assert weight_bytes(f, "bf16") == 2 * (60_817_408 + 2_057_216) == 125_749_248
    assert weight_bytes(f, "fp8") == 60_817_408 + 4 * 47_104 + 2 * 2_057_216 == 65_120_256
    assert kv_bytes_per_token(f) == 2 * 4 * 2 * 128 * 2 == 4096
    assert kv_bytes_per_token(f, kv_dtype="fp8") == 2048
    # TP 4: 2 query heads a rank, the 2 K/V heads replicated (one a rank), MLP 1024 a rank, 250 vocab rows.
    assert kv_bytes_per_token(f, tp=4) == 2 * 4 * 1 * 128 * 2 == 2048
    tp4 = 4 * (1024 * 128 * (2 + 1 + 1) + 2 * 128 * 1024 + 3 * 1024 * 1024)
    assert weight_bytes(f, "bf16", tp=4) == 2 * (tp4 + 4 * 2048 + 2 * 250 * 1024 + 1024) == 32_499_712
    # On a GPU of 1 GiB, 90 % of it, no reserve: 966,367,641 - 125,749,248 bytes left = 205,229 tokens.
    o = option(f, 1, "bf16", GIB, need_tokens=205_229, reserve=0)
    assert (o.weights, o.kv_bytes, o.kv_tokens, o.fits) == (125_749_248, 840_618_393, 205_229, True)
    assert not option(f, 1, "bf16", GIB, need_tokens=205_230, reserve=0).fits
    assert not option(f, 1, "bf16", GIB, need_tokens=1).fits  # the 2 GiB activation reserve: nothing left
    assert tp_sizes(f, 8) == [1, 2, 4, 8] and tp_sizes(f, 6) == [1, 2, 4]
    assert tp_sizes(from_config("h12", {**SMALL, "num_attention_heads": 12, "head_dim": 64}), 8) == [1, 2, 4]


# Published totals (facts, from the model cards and reports): Llama 3.3 70B 70.6B (its safetensors: 70,553,706,496);
# Llama 3 8B 8.03B; Llama 4 Scout "17B active, 109B total"; Mistral Small 3.1 24B; Qwen2.5-32B 32.5B
# (non-embedding 31.0B); Qwen2.5-1.5B 1.54B (1.31B); Qwen3-30B-A3B 30.5B total, 3.3B activated (29.9B);
# Qwen3-4B 4.0B (3.6B); Gemma 3 12B: 417M vision + 1,012M embedding + 10,759M non-embedding = 12.2B;
# SmolLM2-135M 135M.
PUBLISHED = {
    "meta-llama/Llama-3.3-70B-Instruct": dict(total=70.6e9),
    "meta-llama/Meta-Llama-3-8B-Instruct": dict(total=8.03e9),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": dict(total=109e9, active=17e9),
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": dict(total=24e9),
    "Qwen/Qwen2.5-32B-Instruct": dict(total=32.5e9, non_embedding=31.0e9),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(total=1.54e9, non_embedding=1.31e9),
    "Qwen/Qwen3-30B-A3B": dict(total=30.5e9, active=3.3e9, non_embedding=29.9e9),
    "Qwen/Qwen3-4B": dict(total=4.0e9, non_embedding=3.6e9),
    "google/gemma-3-12b-it": dict(total=12.2e9, non_embedding=10.759e9),
    "smollm2-135m": dict(total=135e6),
}


def test_every_model_of_the_table_has_a_published_total():
    assert {f.name for f in BUILTIN.values()} == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_totals(name):
    facts, want = BUILTIN[name.lower()], PUBLISHED[name]
    count = params(facts)
    embedding = facts.vocab * facts.hidden * (1 if facts.tied else 2)
    got = {"total": count["total"], "active": count["active"], "non_embedding": count["text"] - embedding}
    for key, value in want.items():
        assert abs(got[key] / value - 1) < 0.02, (key, got[key], value)


def test_the_shipped_experiment_files_paper_models_are_all_known():
    from byzantium.sweep.config import CONFIGS, load_sweep
    names = {m for path in CONFIGS.glob("*.toml") for c in load_sweep(path, "paper", check_files=False).cells
             for m in c.models}
    served = {"gpt-3.5-turbo", "gpt-4o-mini", "gpt-4o"}  # OpenAI's, served: no open architecture to plan
    assert {n for n in names if n not in served and builtin(n) is None} == set()


def test_configs_parse_like_the_table():
    scout = {"model_type": "llama4", "tie_word_embeddings": False,
             "text_config": {"hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
                             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048,
                             "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_local_experts": 16,
                             "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "attention_chunk_size": 8192,
                             "no_rope_layers": [1, 1, 1, 0] * 12, "max_position_embeddings": 10485760},
             "vision_config": {"hidden_size": 1408, "num_hidden_layers": 34, "intermediate_size": 5632,
                               "hidden_act": "gelu", "model_type": "llama4_vision_model"}}
    qwen_moe = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "intermediate_size": 6144,
                "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
                "mlp_only_layers": [], "tie_word_embeddings": False, "max_position_embeddings": 40960}
    gemma = {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "hidden_size": 3840, "num_hidden_layers": 48, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 262208, "intermediate_size": 15360,
        "max_position_embeddings": 131072, "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 8},
        "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27, "intermediate_size": 4304}}
    for config, name in ((scout, "meta-llama/Llama-4-Scout-17B-16E-Instruct"), (qwen_moe, "Qwen/Qwen3-30B-A3B"),
                         (gemma, "google/gemma-3-12b-it")):
        parsed, table = from_config(name, config), BUILTIN[name.lower()]
        assert parsed.__dict__ | {"source": table.source} == table.__dict__, name


def test_the_choice_bf16_first_then_fp8():
    llama70 = BUILTIN["meta-llama/llama-3.3-70b-instruct"]
    h200 = H200_GIB * GIB
    need = 16 * 4096
    _, one = plan_model(llama70, 1, h200, need)
    assert (one.tp, one.quantization, one.flags(llama70)) == (1, "fp8", ["--quantization", "fp8"])
    _, two = plan_model(llama70, 2, h200, need)  # bf16 on two GPUs beats fp8 on one
    assert (two.tp, two.quantization, two.flags(llama70)) == (2, "bf16", ["--tensor-parallel-size", "2"])
    opts, none = plan_model(llama70, 1, h200, need, fp8=False)
    assert none is None and [(o.tp, o.quantization) for o in opts] == [(1, "bf16")]
    _, a100 = plan_model(llama70, 4, 79.2 * GIB, need)
    assert (a100.tp, a100.quantization) == (4, "bf16")  # TP 2 leaves too little KV on 80 GB cards
    small = BUILTIN["qwen/qwen3-4b"]
    assert plan_model(small, 8, h200, need)[1].tp == 1


# SMALL with 4 routed experts of 512 in every layer (Qwen3-MoE: q/k norms of head_dim, a router of 4 rows).
MOE = {**SMALL, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 512}


def test_moe_experts_in_fp8():
    f = from_config("moe", MOE)
    attention = 1024 * 128 * 12 + 1024 * 1024
    experts = 4 * 3 * 1024 * 512
    kept = 4 * (2 * 1024 + 2 * 128 + 4 * 1024) + 2_048_000 + 1024  # norms, q/k norms, router; embedding, head
    assert rank_params(f) == {"linear": 4 * attention, "rows": 4 * (12 * 128 + 1024), "experts": 4 * experts,
                              "expert_rows": 4 * 4 * (2 * 512 + 1024), "kept": kept}
    assert weight_bytes(f, "bf16") == 2 * (4 * attention + 4 * experts + kept)
    # fp8: the attention linears and the experts at a byte a weight and a scale a row (per expert); the rest bf16
    rows = 4 * (12 * 128 + 1024) + 4 * 4 * (2 * 512 + 1024)
    assert weight_bytes(f, "fp8") == 4 * attention + 4 * experts + 4 * rows + 2 * kept
    # An engine that kept its experts in the compute dtype: they would count at 2 bytes (FP8_EXPERTS).
    assert rank_weight_bytes(f, 1, 1.0, 2, fp8_experts=0.0) == (4 * attention + 4 * 4 * (12 * 128 + 1024)
                                                                + 2 * (4 * experts + kept))
    # TP 2: two experts a rank, whole; the attention heads halved; the vocabulary halved.
    assert rank_params(f, 2)["experts"] == 4 * 2 * 3 * 1024 * 512


def test_the_engine_keeps_moe_experts_as_the_planner_counts_them(tmp_path):
    """engine/memory.py's FP8_EXPERTS against what quantization="fp8" makes of a tiny Qwen3-MoE's experts."""
    from byzantium.engine.engine import Engine
    from byzantium.engine.memory import FP8_EXPERTS
    from test_moe import build_tiny_moe
    build_tiny_moe(num_hidden_layers=1).save_pretrained(tmp_path)
    engine = Engine(tmp_path, device="cpu", dtype="float32", quantization="fp8", num_blocks=8)
    try:
        experts = {n: p.dtype for n, p in engine.model.named_parameters() if n.endswith(("w13", "w2"))}
        linears = {n: p.dtype for n, p in engine.model.named_parameters() if n.endswith("o_proj.weight")}
    finally:
        engine.close()
    assert experts and linears and all(str(d) == "torch.float8_e4m3fn" for d in linears.values())
    want = "torch.float8_e4m3fn" if FP8_EXPERTS else "torch.float32"
    assert all(str(d) == want for d in experts.values()), (
        f"engine/memory.py FP8_EXPERTS = {FP8_EXPERTS}, but quantization='fp8' made the experts {experts}: set "
        "FP8_EXPERTS to what the engine does (byzantium plan and LLMPool.plan count the experts with it), then "
        "the plans written in the ct_table*.toml comments and the table of docs/planning.md")


def write_header(path, tensors):
    """A safetensors file's header only (the planner reads nothing else): {name: (dtype, shape)}."""
    import struct
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = {"BF16": 2, "F8_E4M3": 1, "F32": 4}[dtype]
        for d in shape:
            size *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    data = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(data)) + data)


def test_an_fp8_checkpoint_is_sized_as_stored(tmp_path):
    from byzantium.engine.memory import fp8_shares, model_memory
    fp8 = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}},
           "ignore": ["lm_head", "re:.*layers.0.mlp.*"]}
    folder = checkpoint(tmp_path, {**SMALL, "quantization_config": fp8})
    tensors = {"model.embed_tokens.weight": ("BF16", [1000, 1024]), "lm_head.weight": ("BF16", [1000, 1024]),
               "model.norm.weight": ("BF16", [1024])}
    for i in range(4):
        layer = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", [1024, 1024]), ("self_attn.k_proj", [256, 1024]),
                            ("self_attn.v_proj", [256, 1024]), ("self_attn.o_proj", [1024, 1024]),
                            ("mlp.gate_proj", [4096, 1024]), ("mlp.up_proj", [4096, 1024]),
                            ("mlp.down_proj", [1024, 4096])):
            stored = "BF16" if i == 0 and name.startswith("mlp") else "F8_E4M3"  # layer 0's MLP ignored
            tensors[layer + name + ".weight"] = (stored, shape)
            if stored == "F8_E4M3":
                tensors[layer + name + ".weight_scale"] = ("F32", [shape[0], 1])
        tensors[layer + "input_layernorm.weight"] = ("BF16", [1024])
        tensors[layer + "post_attention_layernorm.weight"] = ("BF16", [1024])
    write_header(folder / "model.safetensors", tensors)
    mlp = 3 * 1024 * 4096
    share = 1 - mlp / (4 * 15_204_352)  # layer 0's MLP is bf16
    assert fp8_shares(folder) == (pytest.approx(share), None)  # no experts
    moe = tmp_path / "moe"
    moe.mkdir()
    write_header(moe / "model.safetensors", {  # stacked (Llama 4) and per-expert names; the router left out
        "model.layers.0.feed_forward.experts.gate_up_proj": ("F8_E4M3", [4, 64, 256]),
        "model.layers.0.feed_forward.experts.down_proj": ("BF16", [4, 128, 64]),
        "model.layers.1.mlp.experts.0.gate_proj.weight": ("F8_E4M3", [128, 64]),
        "model.layers.1.mlp.experts.0.gate_proj.weight_scale": ("F32", [128, 1]),
        "model.layers.0.feed_forward.router.weight": ("BF16", [4, 64]),
        "model.layers.1.mlp.gate.weight": ("BF16", [4, 64])})
    fp8, everything = 4 * 64 * 256 + 128 * 64, 4 * 64 * 256 + 4 * 128 * 64 + 128 * 64
    assert fp8_shares(moe) == (None, pytest.approx(fp8 / everything))
    weights, kv = model_memory(folder, 2)
    linear, rows, kept = 4 * 15_204_352, 4 * 11_776, 4 * 2048 + 2_048_000 + 1024
    assert weights == round(linear * (share + 2 * (1 - share)) + 4 * rows * share + 2 * kept)
    assert weights == pytest.approx(linear - mlp + 2 * mlp + 2 * kept + 4 * rows * share)
    assert kv == 4096 and model_memory(folder, 2, 2, kv_cache_dtype="fp8")[1] == 2 * 4 * 1 * 128
    # A bf16 checkpoint: bf16 unless quantization="fp8"; fp32 on the CPU.
    plain = checkpoint(tmp_path, SMALL, "plain")
    assert model_memory(plain, 2) == (weight_bytes(from_config("s", SMALL), "bf16"), 4096)
    assert model_memory(plain, 2, quantization="fp8")[0] == weight_bytes(from_config("s", SMALL), "fp8")
    assert model_memory(plain, 4, 4) == (4 * rank_params(from_config("s", SMALL), 4)["linear"] +
                                         4 * rank_params(from_config("s", SMALL), 4)["kept"], 2 * 4 * 1 * 128 * 4)


def test_kv_heads_replicated_past_their_count():
    qwen = BUILTIN["qwen/qwen3-30b-a3b"]  # 4 K/V heads
    assert [kv_bytes_per_token(qwen, tp) for tp in (1, 2, 4, 8)] == [2 * 48 * h * 128 * 2 for h in (4, 2, 1, 1)]


def checkpoint(tmp_path, config, name="ckpt"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_an_fp8_checkpoint_is_planned_at_fp8_only(tmp_path):
    fp8 = {"quant_method": "compressed-tensors",
           "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
    facts = model_facts(checkpoint(tmp_path, {**SMALL, "quantization_config": fp8}))
    assert facts.fp8_checkpoint and "its config.json" in facts.source
    opts, chosen = plan_model(facts, 1, H200_GIB * GIB, 1000)
    assert {o.quantization for o in opts} == {"fp8"} and chosen.flags(facts) == []  # loads as FP8 as it is
    int4 = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}}
    with pytest.raises(ValueError, match="is not FP8"):
        model_facts(checkpoint(tmp_path, {**SMALL, "quantization_config": int4}, "int4"))
    assert model_facts(checkpoint(tmp_path, {**SMALL, "quantization_config": {"quant_method": "fp8"}},
                                  "fp8")).fp8_checkpoint


def test_a_model_in_the_hub_cache_is_read_from_there(tmp_path, monkeypatch):
    import huggingface_hub.constants
    snapshot = tmp_path / "models--someone--Small-1B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(SMALL))
    (tmp_path / "models--someone--Small-1B" / "refs").mkdir()
    (tmp_path / "models--someone--Small-1B" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    facts = model_facts("someone/Small-1B")
    assert facts.hidden == 1024 and "Hugging Face cache" in facts.source


def test_unknown_models_say_how_to_give_facts(tmp_path):
    with pytest.raises(ValueError, match=r"unknown model 'nobody/Nothing-7B'.*local checkpoint directory"):
        model_facts("nobody/Nothing-7B")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json there"):
        model_facts(tmp_path / "empty")


def test_bad_flags_are_refused_before_any_model_is_looked_up(monkeypatch, capsys):
    monkeypatch.setattr(plan_command, "model_facts", lambda name: pytest.fail("looked a model up"))
    for argv, said in ((["--gpus", "0"], "--gpus must be >= 1"), (["--gpu-memory", "-1"], "--gpu-memory must be > 0"),
                       (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1"),
                       (["--memory-fraction", "1.5"], "--memory-fraction must be in (0, 1]")):
        assert main(["plan", "meta-llama/Llama-3.3-70B-Instruct", *argv]) == 2
        assert said in capsys.readouterr().err


# ------------------------------------------------------------------------- the real entry point

def cli(*argv, code=None):
    args = [sys.executable, "-m", "byzantium.cli", "plan", *argv] if code is None else [sys.executable, "-c", code]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_command_prints_a_table_per_model():
    done = cli("meta-llama/Llama-3.3-70B-Instruct", "Qwen/Qwen3-30B-A3B")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "1 x 139.8 GiB GPU, 90% of each used, 2 GiB of it reserved" in out and "65,536 tokens" in out
    assert "weights bf16 131.4 GiB, fp8 67.7 GiB" in out
    assert "plan: TP 1 fp8 (--quantization fp8): 183,921 KV tokens left" in out
    assert "3.35B active a token" in out and "plan: TP 1 bf16 (no flags)" in out
    assert "rules: bf16 at the smallest TP that fits, else fp8" in out


def test_the_command_in_json():
    done = cli("meta-llama/Llama-4-Scout-17B-16E-Instruct", "--gpus", "2", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["gpus"] == 2 and data["needed_kv_tokens"] == 16 * 4096 and data["activation_reserve_gib"] == 2.0
    (scout,) = data["models"]
    assert scout["plan"] == {"tensor_parallel_size": 2, "quantization": "bf16", "kv_tokens": scout["plan"]["kv_tokens"],
                             "flags": ["--tensor-parallel-size", "2"]}
    # fp8 on one H200 fits: the routed experts (97 % of Scout) are FP8 too.
    assert [(o["tensor_parallel_size"], o["quantization"], o["fits"]) for o in scout["options"]] == [
        (1, "bf16", False), (2, "bf16", True), (1, "fp8", True), (2, "fp8", True)]
    assert scout["weights_gib"] == {"bf16": 200.74, "fp8": 102.37}
    assert scout["weights_gib"]["bf16"] > 200 and abs(scout["params"] / 109e9 - 1) < 0.02


def test_a_model_that_does_not_fit_says_why():
    done = cli("meta-llama/Llama-3.3-70B-Instruct", "--gpu-memory", "79.2", "--no-fp8")
    assert done.returncode == 0, done.stderr
    assert "plan: does not fit on 1 x 79.2 GiB: the weights alone do not fit (TP 1 bf16: 131.4 GiB a GPU)" in done.stdout


@pytest.mark.parametrize("argv, said", [
    ([], "name at least one model"),
    (["Qwen/Qwen3-4B", "--gpus", "0"], "--gpus must be >= 1, got 0"),
    (["Qwen/Qwen3-4B", "--gpu-memory", "0"], "--gpu-memory must be > 0 GiB"),
    (["nobody/Nothing-7B"], "unknown model 'nobody/Nothing-7B'"),
])
def test_the_command_refuses_bad_input(argv, said):
    done = cli(*argv)
    assert done.returncode == 2 and said in done.stderr and not done.stdout, (done.stdout, done.stderr)


def test_planning_loads_nothing_heavy():
    # The package imports its public names on first use: `import byzantium` loads no torch.
    done = cli(code="import sys, byzantium; before = 'torch' in sys.modules; from byzantium import Engine, LLMPool; "
                    "print(before, 'torch' in sys.modules, Engine.__name__, byzantium.LLMPool is LLMPool, "
                    "'Session' in dir(byzantium))")
    assert done.stdout.splitlines()[-1] == "False True Engine True True", done.stderr
    # Through the CLI: it imports only the plan command's module, so no torch, transformers or FastAPI.
    done = cli(code="import sys; from byzantium.cli import main; rc = main(['plan', 'Qwen/Qwen3-4B', 'smollm2-135m']); "
                    "print(rc, [m for m in ('torch', 'transformers', 'fastapi') if m in sys.modules])")
    assert done.stdout.splitlines()[-1] == "0 []", done.stderr
    # The plan package itself imports no torch: with the package's __init__ left out, none is loaded.
    done = cli(code="import sys, types; pkg = types.ModuleType('byzantium'); pkg.__path__ = ['byzantium']; "
                    "sys.modules['byzantium'] = pkg; import argparse; from byzantium.plan import command; "
                    "ap = argparse.ArgumentParser(); command.add_plan_args(ap); "
                    "command.cmd_plan(ap.parse_args(['meta-llama/Llama-3.3-70B-Instruct', '--json'])); "
                    "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "[]", done.stderr
