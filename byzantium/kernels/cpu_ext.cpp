// The Python module of Byzantium's CPU kernels (built by kernels/cpu_ext.py).
#include <torch/extension.h>

torch::Tensor small_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor seq_lens, torch::Tensor block_tables, double scale);
bool decode_supported(int64_t head_dim);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "fp32 x[M, K] @ w[N, K].T + b for small M");
  m.def("paged_decode_attention", &paged_decode_attention,
        "fp32 decode attention over the paged KV cache (the contract of kernels/reference.py)");
  m.def("decode_supported", &decode_supported, "whether paged_decode_attention has a kernel for this head_dim");
}
