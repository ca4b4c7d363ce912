// The Python module of Byzantium's CPU kernels (built by kernels/cpu_ext.py).
#include <torch/extension.h>

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor seq_lens, torch::Tensor block_tables, double scale, bool avx512,
                                     int64_t window, int64_t chunk);
bool decode_supported(int64_t head_dim);
torch::Tensor paged_prefill_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                      torch::Tensor cu_seqlens_q, torch::Tensor seq_lens, torch::Tensor block_tables,
                                      double scale, int64_t window, int64_t chunk);
bool prefill_supported(int64_t head_dim);
void store_kv(torch::Tensor k, torch::Tensor v, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slot_mapping);
torch::Tensor pack_panels(torch::Tensor w);
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t N);
torch::Tensor pack_glu(torch::Tensor w);
torch::Tensor panel_glu(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t I);
bool avx512_supported();
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                                      double eps);
torch::Tensor silu_mul(torch::Tensor gate_up);
torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor signed_sin);
torch::Tensor pack_panels512(torch::Tensor w);
int64_t race_sample(torch::Tensor x, int64_t stream_lo, int64_t stream_hi);
torch::Tensor argmax_rows(torch::Tensor x);
torch::Tensor panel_linear512(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t N);
torch::Tensor pack_glu512(torch::Tensor w);
torch::Tensor panel_glu512(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t I);
bool avx512_bf16_supported();
torch::Tensor pack_panels_bf16(torch::Tensor w);
torch::Tensor panel_linear_bf16(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t N);
torch::Tensor pack_glu_bf16(torch::Tensor w);
torch::Tensor rms_norm_bf16(torch::Tensor x, torch::Tensor weight, double eps);
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm_bf16(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                                           double eps);
torch::Tensor rope_bf16(torch::Tensor x, torch::Tensor cos, torch::Tensor signed_sin);
torch::Tensor panel_glu_bf16(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t I);

// The kernels run without the GIL, as torch's own operators do, so that other Python threads (an
// AsyncEngine's event loop) are not held up during a step.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using release = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("pack_panels", &pack_panels, "w[N, K] -> panels [N/16, K, 16] for panel_linear", release());
  m.def("panel_linear", &panel_linear, "fp32 x[M, K] @ w.T + b with w packed by pack_panels (b padded to the panels)",
        release());
  m.def("pack_glu", &pack_glu, "gate_up w[2I, K] -> panels [I/8, K, 16] (8 gate, 8 up) for panel_glu", release());
  m.def("panel_glu", &panel_glu, "fp32 silu(x @ gate.T) * (x @ up.T) [M, I] from pack_glu panels", release());
  m.def("avx512_supported", &avx512_supported, "whether this CPU runs panel_linear512");
  m.def("pack_panels512", &pack_panels512, "w[N, K] -> panels [N/32, K, 32] for panel_linear512", release());
  m.def("panel_linear512", &panel_linear512, "AVX-512 fp32 x[M, K] @ w.T + b with w packed by pack_panels512",
        release());
  m.def("pack_glu512", &pack_glu512, "gate_up w[2I, K] -> panels [I/16, K, 32] (16 gate, 16 up) for panel_glu512",
        release());
  m.def("panel_glu512", &panel_glu512, "AVX-512 silu(x @ gate.T) * (x @ up.T) [M, I] from pack_glu512 panels", release());
  m.def("avx512_bf16_supported", &avx512_bf16_supported, "whether this CPU runs panel_linear_bf16 (avx512_bf16)");
  m.def("pack_panels_bf16", &pack_panels_bf16, "bf16 w[N, K] -> panels [N/32, K/2, 32, 2] for panel_linear_bf16",
        release());
  m.def("panel_linear_bf16", &panel_linear_bf16,
        "avx512_bf16 x[M, K] @ w.T + b in bf16 (fp32 sums) with w packed by pack_panels_bf16, b fp32 padded", release());
  m.def("pack_glu_bf16", &pack_glu_bf16, "bf16 gate_up w[2I, K] -> panels (16 gate, 16 up) for panel_glu_bf16",
        release());
  m.def("panel_glu_bf16", &panel_glu_bf16, "avx512_bf16 silu(x @ gate.T) * (x @ up.T) [M, I] in bf16", release());
  m.def("rms_norm_bf16", &rms_norm_bf16, "bf16 RMSNorm of rows [T, H] (cpu_layer_ops_bf16.cpp, avx512_bf16)", release());
  m.def("add_rms_norm_bf16", &add_rms_norm_bf16, "bf16 (RMSNorm(x + residual), x + residual) of rows [T, H]", release());
  m.def("rope_bf16", &rope_bf16, "bf16 x * cos + roll(x, D/2) * signed_sin of x [T, H, D], bf16 tables [T, D]", release());
  m.def("rms_norm", &rms_norm, "fp32 RMSNorm of rows [T, H] (cpu_layer_ops.cpp)", release());
  m.def("add_rms_norm", &add_rms_norm, "fp32 (RMSNorm(x + residual), x + residual) of rows [T, H]", release());
  m.def("silu_mul", &silu_mul, "fp32 silu(gate) * up of rows [T, 2I] -> [T, I]", release());
  m.def("rope", &rope, "fp32 x * cos + roll(x, D/2) * signed_sin of x [T, H, D], tables [T, D]", release());
  m.def("argmax_rows", &argmax_rows, "torch.argmax(x, -1) of fp32 rows [N, V] (cpu_sampling.cpp)", release());
  m.def("race_sample", &race_sample, "argmax of fp32 logits [V] + Gumbel noise of the stream (cpu_sampling.cpp)",
        release());
  m.def("paged_decode_attention", &paged_decode_attention,
        "fp32 decode attention over the paged KV cache (the contract of kernels/reference.py); avx512=False: "
        "the AVX2 kernel even where the AVX-512 one could run; window, chunk: the masks (0: none)",
        pybind11::arg("q"), pybind11::arg("k_cache"), pybind11::arg("v_cache"), pybind11::arg("seq_lens"),
        pybind11::arg("block_tables"), pybind11::arg("scale"), pybind11::arg("avx512") = true,
        pybind11::arg("window") = 0, pybind11::arg("chunk") = 0, release());
  m.def("paged_prefill_attention", &paged_prefill_attention,
        "fp32 causal prefill attention over the paged KV cache, AVX-512 (cpu_prefill.h); window, chunk: the "
        "masks (0: none)", pybind11::arg("q"), pybind11::arg("k_cache"), pybind11::arg("v_cache"),
        pybind11::arg("cu_seqlens_q"), pybind11::arg("seq_lens"), pybind11::arg("block_tables"),
        pybind11::arg("scale"), pybind11::arg("window") = 0, pybind11::arg("chunk") = 0, release());
  m.def("prefill_supported", &prefill_supported, "whether paged_prefill_attention runs here for this head_dim");
  m.def("store_kv", &store_kv, "k, v [T, Hkv, D] into their paged cache slots (-1: skipped)", release());
  m.def("decode_supported", &decode_supported, "whether paged_decode_attention has a kernel for this head_dim");
}
