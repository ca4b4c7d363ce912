"""The Llama family on the paged KV cache: Llama, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k RMSNorm).

Reads top to bottom: norm, rotary embedding, attention, MLP, decoder layer, model, weight loading.
Inputs are packed: `input_ids` and `positions` are [T] for all sequences of a step together, and
`meta` (runner.AttentionMetadata) says which rows belong to which sequence and where their K/V live.
Q/K/V and gate/up projections are fused into one matmul each.
"""
import torch
import torch.nn.functional as F
from torch import nn

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}


def architecture_of(config):
    """The supported architecture name of a transformers config, or a ValueError naming the supported ones."""
    names = getattr(config, "architectures", None) or [MODEL_TYPES.get(getattr(config, "model_type", None), "")]
    if names[0] not in ARCHITECTURES:
        found = names[0] or getattr(config, "model_type", "?")
        raise ValueError(f"unsupported architecture {found!r}; supported: {', '.join(ARCHITECTURES)}")
    return names[0]


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # transformers' formula op for op (normalise in fp32, scale in the input dtype); on CPU it is
        # also faster than F.rms_norm for the small rows of decode steps.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(config, head_dim, max_positions):
    """cos, sin [max_positions, head_dim // 2] in fp32, with the config's rope scaling (transformers' own
    init functions for the scaled types, so every variant matches the reference implementation)."""
    # transformers 5 keeps rope settings in rope_parameters, 4.x in rope_scaling + rope_theta.
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scaling = 1.0
    elif rope_type == "dynamic":
        raise NotImplementedError("dynamic rope scaling changes with sequence length and is not supported")
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
    return freqs.cos() * scaling, freqs.sin() * scaling


def apply_rope(x, cos, signed_sin):
    """x [T, H, D]; cos = cat(c, c), signed_sin = cat(-s, s), each [T, 1, D]: transformers' rotate-half
    x * cos + rotate_half(x) * sin, with the sign folded into the table so rotate_half is a roll."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin


class Attention(nn.Module):
    def __init__(self, config, arch):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.scale = self.head_dim ** -0.5
        qkv_bias = arch == "Qwen2ForCausalLM" or bool(getattr(config, "attention_bias", False))
        o_bias = arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and bool(getattr(config, "attention_bias", False))
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=o_bias)
        self.qk_norm = arch == "Qwen3ForCausalLM"
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
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        else:  # rotate q and k heads together: half the elementwise ops
            qk = apply_rope(qkv[:, :self.q_size + self.kv_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin)
            q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        ops = meta.ops
        ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        d = meta.num_decode
        if d == T:
            out = ops.paged_decode_attention(q, k_cache, v_cache, meta.decode_seq_lens, meta.decode_block_tables, self.scale)
        elif d == 0:
            out = ops.append_prefill_attention(q, k_cache, v_cache, meta.cu_seqlens_q, meta.prefill_seq_lens,
                                               meta.prefill_block_tables, self.scale)
        else:
            out = torch.empty_like(q)
            out[:d] = ops.paged_decode_attention(q[:d], k_cache, v_cache, meta.decode_seq_lens,
                                                 meta.decode_block_tables, self.scale)
            out[d:] = ops.append_prefill_attention(q[d:], k_cache, v_cache, meta.cu_seqlens_q,
                                                   meta.prefill_seq_lens, meta.prefill_block_tables, self.scale)
        return self.o_proj(out.view(T, self.q_size))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        if config.hidden_act not in ("silu", "swish"):
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r}: the Llama family uses silu")

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config, arch):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, arch)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, meta, k_cache, v_cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config, arch):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, arch) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Also serves Mistral, Qwen2 and Qwen3: the differences are biases, q/k norms and rope settings."""

    # checkpoint name -> (our fused parameter, which slice)
    packed = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, config):
        super().__init__()
        arch = architecture_of(config)
        self.config, self.arch = config, arch
        self.model = LlamaModel(config, arch)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        attn = self.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.max_positions = config.max_position_embeddings
        cos, sin = rope_tables(config, self.head_dim, self.max_positions)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_buffers(self, device):
        """After to_empty: the rope tables (fp32, computed) and the tied lm_head."""
        self.rope_cos, self.rope_sin = (t.to(device) for t in rope_tables(self.config, self.head_dim, self.max_positions))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions, meta, kv_cache):
        """Hidden states [T, hidden] of the packed tokens; K/V written to kv_cache[layer, 0/1]."""
        x = self.model.embed_tokens(input_ids)
        cos = self.rope_cos.index_select(0, positions).to(x.dtype).unsqueeze(1)
        sin = self.rope_sin.index_select(0, positions).to(x.dtype).unsqueeze(1)
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, meta, kv_cache[i, 0], kv_cache[i, 1])
        return self.model.norm(x)

    def compute_logits(self, hidden):
        return self.lm_head(hidden).float()

    def load_weights(self, named_tensors):
        """Copy checkpoint tensors (transformers names) into our fused parameters; check none is missing."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in named_tensors:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            target, part = name, None
            for ckpt, (ours, index) in self.packed.items():
                if f".{ckpt}." in name:
                    target, part = name.replace(f".{ckpt}.", f".{ours}."), index
                    break
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in {self.arch}")
            param = params[target]
            with torch.no_grad():
                if part is None:
                    param.copy_(tensor)
                else:
                    param.narrow(0, *self._slice(target, part)).copy_(tensor)
            loaded.add((target, part))
        expected = set()
        for target in params:
            kind = target.rsplit(".", 2)[-2]
            parts = {"qkv_proj": 3, "gate_up_proj": 2}.get(kind)
            expected |= {(target, p) for p in range(parts)} if parts else {(target, None)}
        if self.tie_word_embeddings:
            expected.discard(("lm_head.weight", None))
        missing = sorted(str(t if p is None else f"{t}[{p}]") for t, p in expected - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")

    def _slice(self, target, part):
        """(start, length) of part `part` within a fused parameter, along dim 0."""
        if ".qkv_proj." in target:
            attn = self.model.layers[0].self_attn
            sizes = [attn.q_size, attn.kv_size, attn.kv_size]
        else:
            sizes = [self.config.intermediate_size] * 2
        return sum(sizes[:part]), sizes[part]
