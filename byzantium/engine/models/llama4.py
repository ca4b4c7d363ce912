"""Llama 4's text model on the paged KV cache: Llama4ForCausalLM (model_type llama4_text) and the text tower
of Llama4ForConditionalGeneration checkpoints (the vision model and projector are skipped).

What sets it apart from the Llama family (transformers' modeling_llama4.py is the reference, op for op):
- RoPE layers (no_rope_layers[i] == 1) rotate q and k in the interleaved (complex) form: the pairs
  (x[2j], x[2j + 1]), not the two halves, turn by frequency j; then, with use_qk_norm, q and k are
  L2-normalised per head (an RMS norm without weight).
- The other layers are NoPE: no rotation, and with attn_temperature_tuning their queries are scaled by
  log1p(floor((p + 1) / floor_scale)) * attn_scale + 1 at position p.
- Layers whose layer_types entry is chunked_attention (by default the RoPE ones) attend within their chunk
  of attention_chunk_size tokens: the query at p sees keys [p // C * C, p] (the attention ops' `chunk`;
  the torch and cpu backends have it). The others attend to the whole context.
- MoE layers (moe_layers, by default every interleave_moe_layer_step-th) route each token to its top-k
  experts (k = 1 in the released models) by router logit; sigmoid(logit) scales the expert's input (not
  its output), and a shared expert (a dense SwiGLU MLP) is added. Dense layers use intermediate_size_mlp.

Reads top to bottom: settings, attention, MoE block, decoder layer, model (weights are loaded by
engine/weights.py: TEXT_ONLY and TEXT_TOWER declare the checkpoints' names); the blocks
(norm, paged attention, gated MLP, fused_moe) are engine/layers/'s and kernels/moe.py's. Inputs are packed
as in llama.py ([T] tokens of all sequences of a step, `meta` from runner.AttentionMetadata).
"""
import torch
from torch import nn

from ...kernels.moe import fused_moe
from ..layers import parallel
from ..layers.attention import AttentionProjections, PagedAttention
from ..layers.lm_head import add_lm_head, retie
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from ..weights import WeightNames, load_weights

ARCHITECTURES = ("Llama4ForCausalLM", "Llama4ForConditionalGeneration")
MODEL_TYPES = {"llama4_text": "Llama4ForCausalLM", "llama4": "Llama4ForConditionalGeneration"}
CHUNKED, FULL = "chunked_attention", "full_attention"
# Checkpoint names. Routed experts come stacked as transformers saves them, transposed ([E, H, 2I] and
# [E, I, H]: the checkpoint multiplies x @ W, we W @ x), or one linear per expert as llm-compressor writes
# them (RedHatAI's Llama-4-Scout FP8 release). Multimodal checkpoints: where their text tower's tensors live
# (the saved names, and transformers 5's in-memory ones), None for the vision parts (skipped).
TEXT_ONLY = WeightNames(experts_transposed=True)
TEXT_TOWER = WeightNames((("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                          ("model.language_model.", "model."), ("lm_head.", "lm_head."),
                          ("vision_model.", None), ("multi_modal_projector.", None),
                          ("model.vision_model.", None), ("model.multi_modal_projector.", None)),
                         experts_transposed=True)


def architecture_of(config):
    """The checkpoint's architecture (its weight names), or None when the config is not Llama 4's."""
    names = getattr(config, "architectures", None) or [MODEL_TYPES.get(getattr(config, "model_type", None))]
    return names[0] if names[0] in ARCHITECTURES else None


def check_settings(config):
    """ValueError naming a setting this implementation does not cover."""
    if config.hidden_act not in ("silu", "swish"):
        raise ValueError(f"unsupported hidden_act {config.hidden_act!r}: Llama 4's MLPs and experts are SwiGLU (silu)")
    unknown = sorted(set(config.layer_types) - {CHUNKED, FULL})
    if unknown:
        raise ValueError(f"unsupported Llama 4 layer_types {unknown}; supported: {CHUNKED}, {FULL}")
    if CHUNKED in config.layer_types and not config.attention_chunk_size:
        raise ValueError("Llama 4 layer_types has chunked_attention layers but attention_chunk_size is not set")


def rope_inv_freq(config, head_dim):
    """(inv_freq [head_dim // 2] fp32, scaling), as transformers computes them (its init functions for the
    scaled kinds, llama3 in the released models)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "dynamic":
        raise ValueError("unsupported Llama 4 rope_type 'dynamic': it changes with sequence length")
    with torch.device("cpu"):  # also while the model is built on the meta device: these need real values
        if rope_type == "default":
            base = params.get("rope_theta", getattr(config, "rope_theta", 500000.0))
            return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)), 1.0
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")


def rope_interleaved(x, cos, sin):
    """x [T, H, D] with cos, sin [T, 1, D/2] (fp32): each pair (x[2j], x[2j + 1]) as a complex number times
    e^(i angle_j), computed in fp32 and cast back as transformers' apply_rotary_emb does."""
    pairs = x.float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).to(x.dtype)


def l2_norm(x, eps):
    """Llama 4's q/k norm: RMS-normalise each head in fp32, no weight."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Attention(AttentionProjections):
    def __init__(self, config, index):
        bias = bool(getattr(config, "attention_bias", False))  # q, k, v and o alike in transformers
        super().__init__(config, qkv_bias=bias, o_bias=bias)
        self.use_rope = bool(config.no_rope_layers[index])
        self.qk_norm_eps = config.rms_norm_eps if config.use_qk_norm and self.use_rope else None
        self.temperature_tuning = bool(config.attn_temperature_tuning) and not self.use_rope
        chunk = config.attention_chunk_size if config.layer_types[index] == CHUNKED else None
        self.attn = PagedAttention(self.head_dim ** -0.5, chunk=chunk)

    def forward(self, x, cos, sin, temperature, meta, k_cache, v_cache):
        q, k, v = self.split_qkv(x)
        if self.use_rope:
            q, k = rope_interleaved(q, cos, sin), rope_interleaved(k, cos, sin)
            if self.qk_norm_eps is not None:
                q, k = l2_norm(q, self.qk_norm_eps), l2_norm(k, self.qk_norm_eps)
        elif self.temperature_tuning:
            q = (q * temperature).to(q.dtype)  # fp32 scales, as transformers multiplies them
        return self.output(self.attn(q, k, v, meta, k_cache, v_cache))


class MoeBlock(nn.Module):
    """Routed experts (stacked: w13 [E, 2I, H] gate rows then up rows, w2 [E, H, I], as models/moe.py, FP8
    ones with w13_scale / w2_scale) plus the shared expert. Under tensor parallelism each rank holds a share
    of the experts, whole."""

    def __init__(self, config):
        super().__init__()
        hidden, inter, self.num_experts = config.hidden_size, config.intermediate_size, config.num_local_experts
        self.top_k = config.num_experts_per_tok
        self.tp = parallel.current()
        self.router = nn.Linear(hidden, self.num_experts, bias=False)
        self.shared_expert = GatedMLP(hidden, inter)
        self.experts = parallel.experts_of_rank(self.num_experts)  # the ids of this rank's experts
        self.w13 = nn.Parameter(torch.empty(len(self.experts), 2 * inter, hidden))
        self.w2 = nn.Parameter(torch.empty(len(self.experts), hidden, inter))
        self.register_parameter("w13_scale", None)  # FP8 experts' row scales (moe.use_fp8_experts)
        self.register_parameter("w2_scale", None)

    def forward(self, x):
        T, hidden = x.shape
        top, ids = torch.topk(self.router(x), self.top_k, dim=-1)
        scores = torch.sigmoid(top.float()).to(x.dtype)
        # The score scales the expert's input, and SiLU makes that differ from scaling its output: each
        # (token, choice) is a row of its own, weighted 1 (top-1: the tokens themselves, scaled).
        rows = (x[:, None, :] * scores[:, :, None]).reshape(-1, hidden)
        ids = ids.reshape(-1, 1)
        weights = torch.ones(ids.shape, dtype=x.dtype, device=x.device)
        if self.tp.size > 1:  # choices of another rank's experts weigh 0 here (computed in vain on one of ours)
            local = ids - self.experts.start
            weights = weights.masked_fill((local < 0) | (local >= len(self.experts)), 0)
            ids = local.clamp(0, len(self.experts) - 1)
        routed = fused_moe(rows, self.w13, self.w2, weights, ids, w13_scale=self.w13_scale,
                           w2_scale=self.w2_scale).view(T, self.top_k, hidden).sum(1)
        return self.shared_expert(x) + parallel.all_reduce(routed, self.tp)


class DecoderLayer(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        moe = index in config.moe_layers
        self.feed_forward = MoeBlock(config) if moe else GatedMLP(config.hidden_size, config.intermediate_size_mlp)

    def forward(self, x, residual, cos, sin, temperature, meta, k_cache, v_cache):
        """As llama.py's: returns this layer's output and the residual stream before it."""
        h, residual = self.input_layernorm.add_forward(x, residual)
        h, residual = self.post_attention_layernorm.add_forward(
            self.self_attn(h, cos, sin, temperature, meta, k_cache, v_cache), residual)
        return self.feed_forward(h), residual


class Llama4Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = parallel.VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Llama4ForCausalLM(nn.Module):
    """Built from a Llama4TextConfig, or a Llama4Config (multimodal: its text_config is what runs here)."""

    def __init__(self, config):
        super().__init__()
        self.arch = architecture_of(config)
        if self.arch is None:
            raise ValueError(f"not a Llama 4 config: {getattr(config, 'architectures', None)}")
        text = config.get_text_config(decoder=True)
        check_settings(text)
        self.config = text
        self.tp = parallel.current()
        self.model = Llama4Model(text)
        # tied if either config says so (the released ones do not)
        add_lm_head(self, text.hidden_size, text.vocab_size, getattr(config, "tie_word_embeddings", False)
                    or getattr(text, "tie_word_embeddings", False))
        attn = self.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        # Chunked layers implement their chunk and NoPE layers need no table: the whole context is served
        # (10M positions for Scout: the rope angles are computed per step, not tabled).
        self.max_positions = text.max_position_embeddings
        self.floor_scale, self.attn_scale = float(text.floor_scale), float(text.attn_scale)
        self._make_buffers(None)  # on the default device (meta while the engine builds the model)

    def _make_buffers(self, device):
        inv_freq, self.rope_scaling = rope_inv_freq(self.config, self.head_dim)
        self.register_buffer("inv_freq", inv_freq.float().to(device), persistent=False)

    def init_buffers(self, device):
        """After to_empty: the rope frequencies (fp32) and the tied lm_head."""
        self._make_buffers(device)
        retie(self)

    def use_cpu_ops(self, kernels):
        """The norms and SiLU * up (dense MLPs and shared experts) on the compiled CPU kernels; the
        interleaved rope, L2 norms and experts stay torch's."""
        bf16 = kernels is not None and kernels.avx512_bf16_supported()
        for module in self.modules():
            if isinstance(module, GatedMLP):
                module.use_cpu_ops(kernels)
            elif isinstance(module, RMSNorm):
                module.cpu_ops, module.bf16_ops = kernels, bf16

    def forward(self, input_ids, positions, meta, kv_cache):
        """Hidden states [T, hidden] of the packed tokens; K/V written to kv_cache[layer, 0/1]."""
        x = self.model.embed_tokens(input_ids)
        p = positions.float()
        freqs = p[:, None] * self.inv_freq[None, :]
        cos, sin = (freqs.cos() * self.rope_scaling)[:, None, :], (freqs.sin() * self.rope_scaling)[:, None, :]
        temperature = (torch.log1p(torch.floor((p + 1.0) / self.floor_scale)) * self.attn_scale + 1.0)[:, None, None]
        residual = None
        for i, layer in enumerate(self.model.layers):
            x, residual = layer(x, residual, cos, sin, temperature, meta, kv_cache[i, 0], kv_cache[i, 1])
        return self.model.norm.add_forward(x, residual)[0]

    def compute_logits(self, hidden):
        return parallel.vocab_logits(self.lm_head, hidden, self.config.vocab_size, self.tp)

    def load_weights(self, named_tensors):
        """Checkpoint tensors (transformers names, text-only or multimodal) into our parameters:
        engine/weights.py."""
        load_weights(self, named_tensors, TEXT_TOWER if self.arch == "Llama4ForConditionalGeneration" else TEXT_ONLY)
