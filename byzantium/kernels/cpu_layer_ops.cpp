// The small operations of a decoder layer, the torch side (the kernels: cpu_layer_ops.h): RMSNorm (with the
// residual add before it), SiLU(gate) * up and the rotary embedding, in fp32 (AVX2) and, for bf16 models on
// CPUs with avx512_bf16, in bf16 (the *_bf16 functions; no silu_mul: a bf16 MLP fuses it into its gate_up
// linear). Rows are independent, so a row's result does not depend on the others in the call.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <tuple>
#include "cpu_kernels.h"

bool avx512_bf16_supported();

namespace {

// Rows per thread below which a call stays on one thread (a decode step): a parallel region costs more.
int64_t grain(int64_t row_elements) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_elements)); }

template <class T>
struct Rows {  // fp32 rows on AVX2, or bf16 rows on avx512_bf16
  static constexpr bool bf16 = std::is_same<T, uint16_t>::value;
  using Ops = std::conditional_t<bf16, RowOps<Avx512Bf16, uint16_t>, RowOps<Avx2, float>>;
  static constexpr auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  static constexpr const char* element = bf16 ? "bf16" : "fp32";
  static const T* in(const torch::Tensor& t) { return (const T*)t.data_ptr(); }
  static T* out(torch::Tensor& t) { return (T*)t.data_ptr(); }
  static void check_cpu(const char* name) {
    TORCH_CHECK(!bf16 || avx512_bf16_supported(), name, ": this CPU has no avx512_bf16");
  }
};

template <class T>
void check_norm(const char* name, const torch::Tensor& x, const torch::Tensor& weight) {
  Rows<T>::check_cpu(name);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == Rows<T>::dtype && x.stride(1) == 1, name, ": ", Rows<T>::element,
              " rows [T, H]");
  TORCH_CHECK(weight.scalar_type() == Rows<T>::dtype && weight.numel() == x.size(1) && weight.is_contiguous(), name,
              ": ", Rows<T>::element, " weight [H]");
}

// RMSNorm of rows x [T, H].
template <class T>
torch::Tensor norm(const char* name, torch::Tensor x, torch::Tensor weight, double eps) {
  check_norm<T>(name, x, weight);
  const int64_t rows = x.size(0), H = x.size(1), ld = x.stride(0);
  auto out = torch::empty({rows, H}, x.options());
  const T *xp = Rows<T>::in(x), *wp = Rows<T>::in(weight);
  T* op = Rows<T>::out(out);
  at::parallel_for(0, rows, grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) Rows<T>::Ops::norm(xp + t * ld, wp, op + t * H, H, (float)eps);
  });
  return out;
}

// The residual stream's add and the norm after it in one pass: r = x + residual (rounded as torch's add);
// returns (RMSNorm(r), r).
template <class T>
std::tuple<torch::Tensor, torch::Tensor> add_norm(const char* name, torch::Tensor x, torch::Tensor residual,
                                                  torch::Tensor weight, double eps) {
  check_norm<T>(name, x, weight);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == Rows<T>::dtype && residual.stride(1) == 1,
              name, ": residual like x");
  const int64_t rows = x.size(0), H = x.size(1), ldx = x.stride(0), ldr = residual.stride(0);
  auto out = torch::empty({rows, H}, x.options()), sum = torch::empty({rows, H}, x.options());
  const T *xp = Rows<T>::in(x), *rp = Rows<T>::in(residual), *wp = Rows<T>::in(weight);
  T *op = Rows<T>::out(out), *sp = Rows<T>::out(sum);
  at::parallel_for(0, rows, grain(2 * H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      Rows<T>::Ops::add_norm(xp + t * ldx, rp + t * ldr, sp + t * H, wp, op + t * H, H, (float)eps);
  });
  return {out, sum};
}

// Rotary embedding of x [T, H, D] (heads contiguous, any row stride) with cos = cat(c, c) and signed_sin =
// cat(-s, s), each [T, D] in x's dtype: out = x * cos + roll(x, D / 2) * signed_sin, contiguous.
template <class T>
torch::Tensor rope(const char* name, torch::Tensor x, torch::Tensor cos, torch::Tensor signed_sin) {
  Rows<T>::check_cpu(name);
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == Rows<T>::dtype && x.stride(2) == 1 && x.stride(1) == x.size(2) &&
              x.size(2) % 2 == 0, name, ": ", Rows<T>::element, " [T, H, D] with contiguous heads");
  const int64_t tokens = x.size(0), H = x.size(1), D = x.size(2), ld = x.stride(0);
  TORCH_CHECK(cos.scalar_type() == Rows<T>::dtype && signed_sin.scalar_type() == Rows<T>::dtype && cos.is_contiguous() &&
              signed_sin.is_contiguous() && cos.numel() == tokens * D && signed_sin.numel() == tokens * D, name, ": ",
              Rows<T>::element, " tables [T, D]");
  auto out = torch::empty({tokens, H, D}, x.options());
  const T *xp = Rows<T>::in(x), *cp = Rows<T>::in(cos), *sp = Rows<T>::in(signed_sin);
  T* op = Rows<T>::out(out);
  at::parallel_for(0, tokens, grain(H * D), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) Rows<T>::Ops::rope(xp + t * ld, cp + t * D, sp + t * D, op + t * H * D, H, D);
  });
  return out;
}

}  // namespace

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  return norm<float>("rms_norm", x, weight, eps);
}
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                                      double eps) {
  return add_norm<float>("add_rms_norm", x, residual, weight, eps);
}
torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor signed_sin) {
  return rope<float>("rope", x, cos, signed_sin);
}
torch::Tensor rms_norm_bf16(torch::Tensor x, torch::Tensor weight, double eps) {
  return norm<uint16_t>("rms_norm_bf16", x, weight, eps);
}
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm_bf16(torch::Tensor x, torch::Tensor residual,
                                                           torch::Tensor weight, double eps) {
  return add_norm<uint16_t>("add_rms_norm_bf16", x, residual, weight, eps);
}
torch::Tensor rope_bf16(torch::Tensor x, torch::Tensor cos, torch::Tensor signed_sin) {
  return rope<uint16_t>("rope_bf16", x, cos, signed_sin);
}

// gate_up [T, 2I] (gate, then up) -> silu(gate) * up [T, I], fp32.
torch::Tensor silu_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kFloat && gate_up.stride(1) == 1 &&
              gate_up.size(1) % 2 == 0, "silu_mul: fp32 rows [T, 2I]");
  const int64_t rows = gate_up.size(0), I = gate_up.size(1) / 2, ld = gate_up.stride(0);
  auto out = torch::empty({rows, I}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, grain(3 * I), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) RowOps<Avx2, float>::silu_mul(gp + t * ld, gp + t * ld + I, op + t * I, I);
  });
  return out;
}
