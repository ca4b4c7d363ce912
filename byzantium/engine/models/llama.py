"""The Llama family on the paged KV cache: Llama, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k RMSNorm),
Qwen3-MoE (Qwen3 with sparse expert MLPs: models/moe.py) and the text tower of Mistral 3 checkpoints.

Reads top to bottom: attention, MLP, decoder layer, model. Weights are loaded by engine/weights.py; this
file declares only where a multimodal checkpoint keeps its text tower (TEXT_TOWERS).
Inputs are packed: `input_ids` and `positions` are [T] for all sequences of a step together, and
`meta` (runner.AttentionMetadata) says which rows belong to which sequence and where their K/V live.
Q/K/V and gate/up projections are fused into one matmul each. The blocks (norm, rope, paged attention,
gated MLP) are engine/layers/'s; `use_cpu_ops` puts the norms, the rotary embedding and SiLU * up on the
compiled CPU kernels (the engine turns them on for fp32 and bf16 on the CPU).
"""
from torch import nn

from ..layers import parallel
from ..layers.attention import AttentionProjections, PagedAttention
from ..layers.lm_head import add_lm_head, retie
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from ..layers.rotary import rope, rope_tables, rotate_tables
from ..weights import WeightNames, load_weights
from .moe import SparseMoeBlock, is_sparse_layer

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Qwen3MoeForCausalLM", "Mistral3ForConditionalGeneration")
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
               "mistral3": "Mistral3ForConditionalGeneration"}
QK_NORM = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
O_BIAS = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")  # o_proj follows attention_bias

# Multimodal checkpoints of which the engine serves the text tower: checkpoint name prefix -> ours, or None
# for the vision parts (skipped). Both the original names and transformers 5's (model.language_model.*).
TEXT_TOWERS = {"Mistral3ForConditionalGeneration": WeightNames((
    ("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."), ("lm_head.", "lm_head."),
    ("vision_tower.", None), ("multi_modal_projector.", None),
    ("model.vision_tower.", None), ("model.multi_modal_projector.", None)))}


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


class Attention(AttentionProjections):
    def __init__(self, config, arch):
        bias = bool(getattr(config, "attention_bias", False))
        super().__init__(config, qkv_bias=arch == "Qwen2ForCausalLM" or bias, o_bias=arch in O_BIAS and bias)
        self.scale = self.head_dim ** -0.5
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
        return self.output(self.attn(q, k, v, meta, k_cache, v_cache))

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

    def __init__(self, config):
        super().__init__()
        self.arch = architecture_of(config)  # the checkpoint's: its weight names
        text = text_config(config)  # the decoder's: every size and setting below
        self.config = text
        self.tp = parallel.current()
        self.model = LlamaModel(text, decoder_architecture(config))
        # tied if either config says so (transformers 5 reads the outer one)
        add_lm_head(self, text.hidden_size, text.vocab_size, getattr(config, "tie_word_embeddings", False)
                    or getattr(text, "tie_word_embeddings", False))
        attn = self.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.max_positions = text.max_position_embeddings
        cos, sin = rope_tables(text, self.head_dim, self.max_positions)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_buffers(self, device):
        """After to_empty: the rope tables (fp32, computed) and the tied lm_head."""
        self.rope_cos, self.rope_sin = (t.to(device) for t in rope_tables(self.config, self.head_dim, self.max_positions))
        retie(self)

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
        """Checkpoint tensors (transformers names) into our parameters: engine/weights.py."""
        load_weights(self, named_tensors, TEXT_TOWERS.get(self.arch, WeightNames()))
