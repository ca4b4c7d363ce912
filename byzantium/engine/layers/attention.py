"""Paged attention, the one layer every model's attention calls: K/V stored into the cache, then the
step's single-token rows on the decode kernel and its longer rows on the append-prefill kernel.

The rows of a step come decode rows first (runner.py), `meta.num_decode` of them; `meta.ops` is the
attention backend the runner chose (kernels.attention_ops). `window` W makes a sliding-window layer: the
query at position p sees keys (p - W, p]; None attends to the whole context. `chunk` C makes a chunked
layer (Llama 4's local layers): the query at position p sees keys [p // C * C, p]; only the backends that
say CHUNKED_ATTENTION (torch, triton, cpu) take it (engine/attention_backend.py chooses one of them
for such a model); the others fail with a clear error.

AttentionProjections is what every model's attention module starts from: this rank's heads and the
fused q/k/v (column-parallel) and o (row-parallel) projections around the paged attention."""
import torch
from torch import nn

from ...kernels import backend_name
from . import parallel


class AttentionProjections(nn.Module):
    """Head counts of this rank (layers/parallel.py), qkv_proj [q; k; v] and o_proj, whose partial sums
    over ranks `output` adds up. The models add their rope, norms and PagedAttention."""

    def __init__(self, config, qkv_bias=False, o_bias=False):
        super().__init__()
        heads = config.num_attention_heads
        self.tp = parallel.current()  # the group o_proj's partial sums run over
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.num_heads = parallel.split(heads, "the attention heads")
        self.num_kv_heads = parallel.kv_heads_per_rank(getattr(config, "num_key_value_heads", None) or heads, heads)
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = parallel.column(nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias))
        self.o_proj = parallel.row(nn.Linear(self.q_size, config.hidden_size, bias=o_bias))

    def split_qkv(self, x):
        """q [T, Hq, D], k and v [T, Hkv, D]: views of x's fused projection."""
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return (q.view(T, self.num_heads, self.head_dim), k.view(T, self.num_kv_heads, self.head_dim),
                v.view(T, self.num_kv_heads, self.head_dim))

    def output(self, attended):
        """o_proj of the attention output [T, Hq, D], summed over ranks."""
        return parallel.all_reduce(self.o_proj(attended.reshape(attended.shape[0], self.q_size)), self.tp)


class PagedAttention(nn.Module):
    def __init__(self, scale, window=None, chunk=None):
        super().__init__()
        self.scale, self.window, self.chunk = scale, window, chunk
        # passed only when set: backends without chunked attention keep their signature
        self.extra = {} if chunk is None else {"chunk": chunk}

    def forward(self, q, k, v, meta, k_cache, v_cache):
        """q [T, Hq, D], k and v [T, Hkv, D] of the step's new tokens -> attention output [T, Hq, D]."""
        ops, d, T = meta.ops, meta.num_decode, q.shape[0]
        if self.chunk is not None and not getattr(ops, "CHUNKED_ATTENTION", False):
            raise ValueError(f"attention_backend {backend_name(ops)!r} has no chunked attention, which this model's "
                             f"local layers need (attention_chunk_size={self.chunk}); use attention_backend='auto'")
        ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        if d == T:
            return self._decode(q, meta, k_cache, v_cache)
        if d == 0:
            return self._prefill(q, meta, k_cache, v_cache)
        out = torch.empty_like(q)
        out[:d] = self._decode(q[:d], meta, k_cache, v_cache)
        out[d:] = self._prefill(q[d:], meta, k_cache, v_cache)
        return out

    def _decode(self, q, meta, k_cache, v_cache):
        return meta.ops.paged_decode_attention(q, k_cache, v_cache, meta.decode_seq_lens, meta.decode_block_tables,
                                               self.scale, window=self.window, **self.extra)

    def _prefill(self, q, meta, k_cache, v_cache):
        return meta.ops.append_prefill_attention(q, k_cache, v_cache, meta.cu_seqlens_q, meta.prefill_seq_lens,
                                                 meta.prefill_block_tables, self.scale, window=self.window,
                                                 max_lens=meta.prefill_max_lens, **self.extra)
