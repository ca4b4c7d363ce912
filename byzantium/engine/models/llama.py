"""The Llama family on the paged KV cache: Llama, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k RMSNorm),
Qwen3-MoE (Qwen3 with sparse expert MLPs: models/moe.py) and the text tower of Mistral 3 checkpoints.

Reads top to bottom: attention, MLP, decoder layer, model, weight loading.
Inputs are packed: `input_ids` and `positions` are [T] for all sequences of a step together, and
`meta` (runner.AttentionMetadata) says which rows belong to which sequence and where their K/V live.
Q/K/V and gate/up projections are fused into one matmul each. The blocks (norm, rope, paged attention,
gated MLP) are engine/layers/'s; `use_cpu_ops` puts the norms, the rotary embedding and SiLU * up on the
compiled CPU kernels (the engine turns them on for fp32 and bf16 on the CPU).
"""
import re

import torch
from torch import nn

from ..layers import parallel
from ..layers.attention import PagedAttention
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from ..layers.rotary import rope, rope_tables, rotate_tables
from ..weights import FP8, copy_weight, rank_slice
from .moe import EXPERT_PARAMS, SparseMoeBlock, copy_experts, is_sparse_layer

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Qwen3MoeForCausalLM", "Mistral3ForConditionalGeneration")
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
               "mistral3": "Mistral3ForConditionalGeneration"}
QK_NORM = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
O_BIAS = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")  # o_proj follows attention_bias

# Multimodal checkpoints of which the engine serves the text tower: checkpoint name prefix -> ours, or None
# for the vision parts (skipped). Both the original names and transformers 5's (model.language_model.*).
TEXT_TOWERS = {"Mistral3ForConditionalGeneration": (
    ("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."), ("lm_head.", "lm_head."),
    ("vision_tower.", None), ("multi_modal_projector.", None),
    ("model.vision_tower.", None), ("model.multi_modal_projector.", None))}

# Checkpoint tensors not read: static FP8 activation and K/V scales (activations are scaled per token as
# they come; an FP8 KV cache uses scale 1).
SKIPPED = (".input_scale", ".k_scale", ".v_scale")

# Qwen3-MoE experts: one tensor per expert and projection (checkpoints; FP8 ones with a weight_scale each),
# or transformers 5's stacked ones.
_EXPERT = re.compile(r"(.*\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.weight(_scale)?")
_STACKED_EXPERTS = re.compile(r"(.*\.mlp)\.experts\.(gate_up_proj|down_proj)")


def architecture_of(config):
    """The supported architecture name of a transformers config, or a ValueError naming the supported ones."""
    arch = _named(config)
    if arch not in ARCHITECTURES:
        found = arch or getattr(config, "model_type", "?")
        raise ValueError(f"unsupported architecture {found!r}; supported: {', '.join(ARCHITECTURES)}")
    if arch in TEXT_TOWERS:
        decoder_architecture(config)  # an unsupported text tower fails here too
    return arch


def decoder_architecture(config):
    """The architecture whose decoder layers run: the config's own, or a multimodal checkpoint's text
    tower's (named by its model_type)."""
    if _named(config) not in TEXT_TOWERS:
        return architecture_of(config)
    text = text_config(config)
    arch = MODEL_TYPES.get(getattr(text, "model_type", None))
    if arch is None or arch in TEXT_TOWERS:
        towers = ", ".join(t for t, a in MODEL_TYPES.items() if a not in TEXT_TOWERS)
        raise ValueError(f"unsupported text tower {getattr(text, 'model_type', '?')!r} in {_named(config)}; "
                         f"supported: {towers}")
    return arch


def text_config(config):
    """The decoder's config: a multimodal checkpoint's text_config, the config itself otherwise."""
    return config.get_text_config(decoder=True)


def _named(config):
    names = getattr(config, "architectures", None) or [MODEL_TYPES.get(getattr(config, "model_type", None), "")]
    return names[0]


class Attention(nn.Module):
    def __init__(self, config, arch):
        super().__init__()
        heads = config.num_attention_heads
        self.tp = parallel.current()  # the group o_proj's partial sums run over
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.num_heads = parallel.split(heads, "the attention heads")  # this rank's (layers/parallel.py)
        self.num_kv_heads = parallel.kv_heads_per_rank(getattr(config, "num_key_value_heads", None) or heads, heads)
        self.scale = self.head_dim ** -0.5
        qkv_bias = arch == "Qwen2ForCausalLM" or bool(getattr(config, "attention_bias", False))
        o_bias = arch in O_BIAS and bool(getattr(config, "attention_bias", False))
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = parallel.column(nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias))
        self.o_proj = parallel.row(nn.Linear(self.q_size, config.hidden_size, bias=o_bias))
        self.attn = PagedAttention(self.scale)
        self.cpu_ops = None  # the compiled CPU kernels for the rope (use_cpu_ops)
        self.bf16_ops = False
        self.qk_norm = arch in QK_NORM
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, meta, k_cache, v_cache):
        T = x.shape[0]
        qkv = self.qkv_proj(x)
        v = qkv[:, self.q_size + self.kv_size:].view(T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q = self.q_norm(qkv[:, :self.q_size].view(T, self.num_heads, self.head_dim))
            k = self.k_norm(qkv[:, self.q_size:self.q_size + self.kv_size].view(T, self.num_kv_heads, self.head_dim))
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        else:  # rotate q and k heads together: half the elementwise ops
            qk = self._rope(qkv[:, :self.q_size + self.kv_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim),
                            cos, sin)
            q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        return parallel.all_reduce(self.o_proj(self.attn(q, k, v, meta, k_cache, v_cache).view(T, self.q_size)), self.tp)

    def _rope(self, x, cos, sin):
        return rope(x, cos, sin, self.cpu_ops, self.bf16_ops)


def mlp(config):
    if config.hidden_act not in ("silu", "swish"):
        raise ValueError(f"unsupported hidden_act {config.hidden_act!r}: the Llama family uses silu")
    return GatedMLP(config.hidden_size, config.intermediate_size, bool(getattr(config, "mlp_bias", False)))


class DecoderLayer(nn.Module):
    def __init__(self, config, arch, index):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, arch)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        moe = arch == "Qwen3MoeForCausalLM" and is_sparse_layer(config, index)
        self.mlp = SparseMoeBlock(config) if moe else mlp(config)

    def forward(self, x, residual, cos, sin, meta, k_cache, v_cache):
        """x: the previous layer's output (layer 0: the embeddings, residual None). Returns this layer's
        output and the residual stream before it: the next norm adds them."""
        h, residual = self.input_layernorm.add_forward(x, residual)
        h, residual = self.post_attention_layernorm.add_forward(self.self_attn(h, cos, sin, meta, k_cache, v_cache),
                                                                residual)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, config, arch):
        super().__init__()
        self.embed_tokens = parallel.VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, arch, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Also serves Mistral, Qwen2, Qwen3, Qwen3-MoE and Mistral 3's text tower: the differences are biases,
    q/k norms, sparse MLPs, rope settings and checkpoint names."""

    # checkpoint name -> (our fused parameter, which slice)
    packed = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, config):
        super().__init__()
        self.arch = architecture_of(config)  # the checkpoint's: its weight names
        text = text_config(config)  # the decoder's: every size and setting below
        self.config = text
        self.tp = parallel.current()
        self.model = LlamaModel(text, decoder_architecture(config))
        # tied if either config says so (transformers 5 reads the outer one); load_weights unties them when
        # the checkpoint ships a head that differs from the embedding, as transformers does
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False)
                                        or getattr(text, "tie_word_embeddings", False))
        self.lm_head = nn.Linear(text.hidden_size, parallel.vocab_per_rank(text.vocab_size), bias=False)
        parallel.vocab_parallel(self.lm_head)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        attn = self.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.max_positions = text.max_position_embeddings
        cos, sin = rope_tables(text, self.head_dim, self.max_positions)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_buffers(self, device):
        """After to_empty: the rope tables (fp32, computed) and the tied lm_head."""
        self.rope_cos, self.rope_sin = (t.to(device) for t in rope_tables(self.config, self.head_dim, self.max_positions))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def use_cpu_ops(self, kernels):
        """Run the norms, rotary embedding and SiLU * up on the compiled CPU kernels (fp32 rows, and the norms
        and rope of bf16 rows where the CPU has avx512_bf16; None: torch); on the fp32 or bf16 panels the
        gate_up linear and SiLU * up become one pass (panel_glu, panel_glu512, panel_glu_bf16)."""
        bf16 = kernels is not None and kernels.avx512_bf16_supported()
        for module in self.modules():
            if isinstance(module, GatedMLP):  # also fuses gate_up with SiLU * up where its panels allow
                module.use_cpu_ops(kernels)
            elif isinstance(module, (RMSNorm, Attention)):
                module.cpu_ops, module.bf16_ops = kernels, bf16

    def forward(self, input_ids, positions, meta, kv_cache):
        """Hidden states [T, hidden] of the packed tokens; K/V written to kv_cache[layer, 0/1]."""
        x = self.model.embed_tokens(input_ids)
        cos = self.rope_cos.index_select(0, positions).to(x.dtype).unsqueeze(1)
        sin = self.rope_sin.index_select(0, positions).to(x.dtype).unsqueeze(1)
        cos, sin = rotate_tables(cos, sin)
        residual = None
        for i, layer in enumerate(self.model.layers):
            x, residual = layer(x, residual, cos, sin, meta, kv_cache[i, 0], kv_cache[i, 1])
        return self.model.norm.add_forward(x, residual)[0]

    def compute_logits(self, hidden):
        return parallel.vocab_logits(self.lm_head, hidden, self.config.vocab_size, self.tp)

    def load_weights(self, named_tensors):
        """Copy checkpoint tensors (transformers names) into our fused parameters, each rank its slice
        (weights.copy_weight); check none is missing."""
        params = dict(self.named_parameters())
        loaded, head = set(), None
        for ckpt_name, tensor in named_tensors:
            name = self._rename(ckpt_name)
            if name is None or "rotary_emb.inv_freq" in name or name.endswith(SKIPPED):
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                head = tensor  # kept only if it differs from the embedding (below)
                continue
            target, part = self._target(name)
            if target not in params:
                raise ValueError(f"checkpoint tensor {ckpt_name!r} has no place in {self.arch}")
            param = params[target]
            experts = target.endswith(EXPERT_PARAMS)
            if experts:  # this rank holds some of them, whole
                tensor, part = self._local_expert(target, tensor, part)
                if tensor is None:
                    continue
            scale_target = None
            if param.dtype in FP8 and tensor.dtype not in FP8:  # quantized as it is read, its scales written
                scale_target = target + "_scale" if experts else target.removesuffix("weight") + "weight_scale"
            if experts and part is None:  # stacked experts: one at a time (FP8: each quantized per row)
                copy_experts(param, scale_target and params[scale_target], tensor, ckpt_name)
            else:
                scale = scale_target and self._piece(scale_target, params[scale_target], part)
                copy_weight(self._piece(target, param, part), tensor, parallel.cut_of(self, target), scale, ckpt_name)
            for t in filter(None, (target, scale_target)):
                loaded |= {(t, p) for p in (self._parts(t, params[t]) if part is None else [part])}
        expected = {(t, p) for t, param in params.items() for p in self._parts(t, param)}
        missing = sorted(str(t if p is None else f"{t}[{p}]") for t, p in expected - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")
        embed = self.model.embed_tokens.weight
        if head is not None:
            head = rank_slice(head, parallel.VOCAB, embed.shape).to(embed.device, embed.dtype)
            if not torch.equal(head, embed):
                # As transformers does: a config that ties them, with a checkpoint that ships a different head
                # (Mistral 3's outer config defaults to tied), means the head is the model's own.
                self.lm_head.weight = nn.Parameter(head, requires_grad=False)
                self.tie_word_embeddings = False

    def _local_expert(self, target, tensor, part):
        """(the tensor, its piece) in this rank's share of the experts; (None, None) for another rank's."""
        experts = self.get_submodule(target.rsplit(".", 1)[0]).experts
        if part is None:  # all experts stacked: this rank's rows
            return tensor[experts.start:experts.stop], None
        expert = part[0] if isinstance(part, tuple) else part
        if expert not in experts:
            return None, None
        local = expert - experts.start
        return tensor, (local, part[1]) if isinstance(part, tuple) else local

    def _rename(self, name):
        """A checkpoint name as our text model's name; None for tensors we do not use (vision towers)."""
        for prefix, ours in TEXT_TOWERS.get(self.arch, ()):
            if name.startswith(prefix):
                return None if ours is None else ours + name[len(prefix):]
        return name

    def _target(self, name):
        """(our parameter, which piece of it or None for all of it) of a checkpoint tensor."""
        if m := _EXPERT.fullmatch(name):
            prefix, expert, proj, scale = m[1], int(m[2]), m[3], m[4] or ""
            if proj == "down":
                return f"{prefix}.w2{scale}", expert
            return f"{prefix}.w13{scale}", (expert, int(proj == "up"))
        if m := _STACKED_EXPERTS.fullmatch(name):
            return f"{m[1]}.{'w13' if m[2] == 'gate_up_proj' else 'w2'}", None
        for ckpt, (ours, index) in self.packed.items():
            if f".{ckpt}." in name:
                return name.replace(f".{ckpt}.", f".{ours}."), index
        return name, None

    def _parts(self, target, param):
        """The pieces a parameter is loaded in, one checkpoint tensor each; [None] when it is one tensor."""
        if ".qkv_proj." in target:
            return [0, 1, 2]
        if ".gate_up_proj." in target:
            return [0, 1]
        if target.endswith((".w13", ".w13_scale")):  # experts' [gate; up]
            return [(e, p) for e in range(param.shape[0]) for p in (0, 1)]
        if target.endswith((".w2", ".w2_scale")):
            return list(range(param.shape[0]))
        return [None]

    def _piece(self, target, param, part):
        """The view of `param` that checkpoint piece `part` is copied into."""
        if part is None:
            return param
        if target.endswith((".w13", ".w13_scale")):  # [E, 2I, H] or its scales [E, 2I]
            expert, half = part
            return param[expert].narrow(0, half * param.shape[1] // 2, param.shape[1] // 2)
        if target.endswith((".w2", ".w2_scale")):
            return param[part]
        if ".qkv_proj." in target:
            attn = self.model.layers[0].self_attn
            sizes = [attn.q_size, attn.kv_size, attn.kv_size]
        else:  # gate_up_proj: [gate; up]
            sizes = [param.shape[0] // 2] * 2
        return param.narrow(0, sum(sizes[:part]), sizes[part])
