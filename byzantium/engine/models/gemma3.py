"""Gemma 3's text model on the paged KV cache: Gemma3ForCausalLM, and the text tower of
Gemma3ForConditionalGeneration checkpoints (its vision tower and projector are skipped).

What sets it apart from the Llama family (transformers' modeling_gemma3.py is the reference, op for op):
embeddings scaled by sqrt(hidden_size) in the model dtype; RMSNorm as x * (1 + w) in fp32; q/k norms;
norms before and after both attention and MLP; a gelu(tanh) MLP; attention scale query_pre_attn_scalar^-0.5;
sliding-window layers interleaved with global ones, each kind with its own rope (base rope_local_base_freq
for local layers, the rope scaling for global ones); final logit soft-capping when the config sets it.

Sliding-window layers really attend within their window (the attention ops' `window`): a query at position p
sees keys (p - W, p]. The KV cache still keeps every token of every layer: freeing the blocks that fell out of
all windows is a later optimisation.

Reads top to bottom: rope settings, attention, MLP, decoder layer, model (weights are loaded by
engine/weights.py: WEIGHT_NAMES says where a multimodal checkpoint keeps its text tower); the blocks (norm,
rope, paged attention, gated MLP) are engine/layers/'s. Inputs are packed as in llama.py ([T] tokens of all
sequences of a step, `meta` from runner.AttentionMetadata).
"""
import torch
from torch import nn

from ...kernels.notices import warn_once
from ..layers import parallel
from ..layers.attention import AttentionProjections, PagedAttention
from ..layers.lm_head import add_lm_head, retie
from ..layers.mlp import GatedMLP
from ..layers.norm import GemmaRMSNorm
from ..layers.rotary import apply_rope, rope_at
from ..weights import WeightNames, load_weights

ARCHITECTURES = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
SLIDING, GLOBAL = "sliding_attention", "full_attention"
# Multimodal checkpoints: the vision parts skipped, the text tower where it lives (older and newer layouts).
WEIGHT_NAMES = WeightNames((
    ("vision_tower.", None), ("multi_modal_projector.", None),
    ("model.vision_tower.", None), ("model.multi_modal_projector.", None),
    ("model.language_model.", "model."), ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."), ("language_model.", "model.")))


def layer_types(config):
    """Per layer, SLIDING or GLOBAL: config.layer_types, else every sliding_window_pattern-th layer global."""
    types = getattr(config, "layer_types", None)
    if types is None:
        pattern = getattr(config, "sliding_window_pattern", 6)
        types = [GLOBAL if (i + 1) % pattern == 0 else SLIDING for i in range(config.num_hidden_layers)]
    return list(types)


def rope_inv_freq(config, layer_type, head_dim):
    """(inv_freq [head_dim // 2] fp32, scaling) for one kind of layer, as transformers computes them."""
    params = getattr(config, "rope_parameters", None) or {}
    extra = {}
    if layer_type in params:  # transformers 5: one rope dict per layer type
        params, extra = params[layer_type], {"layer_type": layer_type}
    elif layer_type == SLIDING:  # transformers 4: local layers use rope_local_base_freq, unscaled
        params = {"rope_type": "default", "rope_theta": getattr(config, "rope_local_base_freq", 10000.0)}
    else:  # ... and global layers rope_theta with rope_scaling
        params = dict(getattr(config, "rope_scaling", None) or {}, rope_theta=config.rope_theta)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv_freq, 1.0
    if rope_type == "dynamic":
        raise NotImplementedError("dynamic rope scaling changes with sequence length and is not supported")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    with torch.device("cpu"):  # also while the model is built on the meta device: these need real values
        return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", **extra)


class Attention(AttentionProjections):
    def __init__(self, config, layer_type):
        bias = bool(getattr(config, "attention_bias", False))
        super().__init__(config, qkv_bias=bias, o_bias=bias)
        self.scale = config.query_pre_attn_scalar ** -0.5
        self.attn = PagedAttention(self.scale, config.sliding_window if layer_type == SLIDING else None)
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, meta, k_cache, v_cache):
        q, k, v = self.split_qkv(x)
        q, k = apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)
        return self.output(self.attn(q, k, v, meta, k_cache, v_cache))


def mlp(config):
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported hidden_activation {act!r}: Gemma 3 uses gelu_pytorch_tanh")
    return GatedMLP(config.hidden_size, config.intermediate_size, activation="gelu_tanh")


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_type):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_type)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp(config)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, meta, k_cache, v_cache):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, meta, k_cache, v_cache))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = parallel.VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, kind) for kind in layer_types(config))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class Gemma3ForCausalLM(nn.Module):
    """Built from a Gemma3TextConfig, or a Gemma3Config (multimodal: its text_config is what runs here)."""

    def __init__(self, config):
        super().__init__()
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.arch = (getattr(config, "architectures", None) or ["Gemma3ForCausalLM"])[0]
        self.config = text
        self.tp = parallel.current()
        if getattr(text, "use_bidirectional_attention", False):
            raise ValueError("Gemma 3 with use_bidirectional_attention (an embedding model) is not supported")
        if getattr(text, "attn_logit_softcapping", None) is not None:
            # transformers' Gemma 3 never passes it to attention (Gemma 3 replaced Gemma 2's soft-capping by
            # q/k norms; released configs set it to null): ignored here too, so outputs match.
            warn_once("byzantium: Gemma 3 ignores attn_logit_softcapping, as transformers does")
        self.final_softcap = getattr(text, "final_logit_softcapping", None)
        self.model = Gemma3Model(text)
        # A multimodal checkpoint ties (or not) at its top level, as transformers reads it.
        add_lm_head(self, text.hidden_size, text.vocab_size, getattr(config, "tie_word_embeddings", True))
        attn = self.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        # Every layer's attention implements its window, so the context is the full rope range.
        self.max_positions = text.max_position_embeddings
        self.implements_sliding_window = True
        self.layer_kinds = sorted({layer.layer_type for layer in self.model.layers})
        self.rope_scaling = {}
        self._make_buffers(None)  # on the default device (meta while the engine builds the model)

    def _make_buffers(self, device):
        for kind in self.layer_kinds:
            inv_freq, self.rope_scaling[kind] = rope_inv_freq(self.config, kind, self.head_dim)
            self.register_buffer(f"inv_freq_{kind}", inv_freq.float().to(device), persistent=False)
        # sqrt(hidden) rounded to the model dtype first, as transformers does (55.43 -> 55.5 in bf16).
        dtype = self.model.embed_tokens.weight.dtype
        scale = torch.tensor(self.config.hidden_size ** 0.5).to(device=device, dtype=dtype)
        self.register_buffer("embed_scale", scale, persistent=False)

    def init_buffers(self, device):
        """After to_empty: the rope frequencies, the embedding scale and the tied lm_head."""
        self._make_buffers(device)
        retie(self)

    def forward(self, input_ids, positions, meta, kv_cache):
        """Hidden states [T, hidden] of the packed tokens; K/V written to kv_cache[layer, 0/1]."""
        x = self.model.embed_tokens(input_ids) * self.embed_scale
        rope = {kind: rope_at(positions, getattr(self, f"inv_freq_{kind}"), self.rope_scaling[kind], x.dtype)
                for kind in self.layer_kinds}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, *rope[layer.layer_type], meta, kv_cache[i, 0], kv_cache[i, 1])
        return self.model.norm(x)

    def compute_logits(self, hidden):
        logits = parallel.vocab_logits(self.lm_head, hidden, self.config.vocab_size, self.tp)
        if self.final_softcap is not None:  # cap * tanh(logits / cap)
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def load_weights(self, named_tensors):
        """Checkpoint tensors (transformers names, either layout) into our parameters: engine/weights.py."""
        load_weights(self, named_tensors, WEIGHT_NAMES)
