// The Python module of Byzantium's CPU kernels (built by kernels/cpu_ext.py).
#include <torch/extension.h>

torch::Tensor small_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "fp32 x[M, K] @ w[N, K].T + b for small M");
}
