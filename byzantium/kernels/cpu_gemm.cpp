// The panel linears' torch side (the kernel: cpu_gemm.h), once for their three forms: panel_linear (fp32,
// AVX2: panels of 16 columns), panel_linear512 (fp32, AVX-512: 32) and panel_linear_bf16 (bf16 on
// avx512_bf16: 32 columns of (k, k + 1) weight pairs); pack_* lay a weight out as panels once, *_glu the
// gate_up linear of an MLP fused with SiLU * up. The AVX-512 forms check the CPU first: the linear choice
// (kernels/linear_choice.py) times them against the others only where they run.
//
// At 32 rows the AVX2 kernel streams a decode step's weights faster than oneDNN, but at half the vector
// width loses to it at prefill, where the arithmetic bounds it: hence the AVX-512 form. Prefill-sized
// products share (row chunk, panels) units between the threads (cpu_panel_schedule.h).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include "cpu_kernels.h"
#include "cpu_panel_schedule.h"

bool avx512_supported() { return __builtin_cpu_supports("avx512f"); }
bool avx512_bf16_supported() { return avx512_supported() && __builtin_cpu_supports("avx512bf16"); }

namespace {

template <class P>
struct Form {  // what the torch side needs to know of a PanelKernel instantiation
  static constexpr bool bf16 = std::is_same<typename P::T, uint16_t>::value;
  static constexpr auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  static constexpr const char* element = bf16 ? "bf16" : "fp32";
  static bool runs_here() {
    if constexpr (std::is_same<typename P::V, Avx2>::value) return true;  // the library needs AVX2 to load
    if constexpr (std::is_same<typename P::V, Avx512>::value) return avx512_supported();
    return avx512_bf16_supported();
  }
};

// w [N, K] -> [ceil(N / NR), K, NR] (fp32) or [ceil(N / NR), ceil(K / 2), NR, 2] (bf16: each column's
// (k, k + 1) weights side by side); columns past N and the k past an odd K are zero.
template <class P>
torch::Tensor pack(const char* name, torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == Form<P>::dtype, name, ": ", Form<P>::element, " [N, K] weight");
  const int64_t N = w.size(0), K = w.size(1), panels = (N + P::NR - 1) / P::NR, steps = (K + P::STEP - 1) / P::STEP;
  auto padded = torch::zeros({panels * P::NR, steps * P::STEP}, w.options());
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(w);
  auto packed = padded.view({panels, P::NR, steps, P::STEP}).permute({0, 2, 1, 3}).contiguous();
  return P::STEP == 1 ? packed.view({panels, K, P::NR}) : packed;
}

// Gate and up rows of a fused gate_up weight w [2I, K] as the GLU kernel reads them: panel p holds gate
// rows p NR/2 .. (p + 1) NR/2 - 1 as its low half and the matching up rows I + p NR/2 .. as its high half
// (rows past I zero).
template <class P>
torch::Tensor pack_glu(const char* name, torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == Form<P>::dtype && w.size(0) % 2 == 0, name, ": ",
              Form<P>::element, " [2I, K] weight");
  const int64_t I = w.size(0) / 2, K = w.size(1), half = P::NR / 2, panels = (I + half - 1) / half;
  auto gate = torch::zeros({panels * half, K}, w.options()), up = torch::zeros({panels * half, K}, w.options());
  gate.narrow(0, 0, I).copy_(w.narrow(0, 0, I));
  up.narrow(0, 0, I).copy_(w.narrow(0, I, I));
  auto interleaved = torch::cat({gate.view({panels, half, K}), up.view({panels, half, K})}, 1);  // [panels, NR, K]
  return pack<P>(name, interleaved.view({panels * P::NR, K}));
}

// x [M, K] @ w.T + bias for w packed by pack, N output columns; GLU: silu(x @ gate.T + bias_gate) *
// (x @ up.T + bias_up) [M, N] for w packed by pack_glu (N = I), the [M, 2I] product never written out.
// `bias`, when given, fp32 laid out as the panels are (NR a panel: padded, or NR/2 gate then NR/2 up).
template <class P, bool GLU>
torch::Tensor run(const char* name, torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias,
                  int64_t N) {
  using T = typename P::T;
  constexpr int64_t NR = P::NR, OUT = GLU ? NR / 2 : NR;  // OUT: outputs a panel
  TORCH_CHECK(Form<P>::runs_here(), name, ": this CPU has no ", Form<P>::bf16 ? "avx512_bf16" : "AVX-512");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == (P::STEP == 1 ? 3 : 4) && packed.size(2) == NR &&
              packed.size(1) == (x.size(1) + P::STEP - 1) / P::STEP && (P::STEP == 1 || packed.size(3) == 2),
              name, ": shapes");
  TORCH_CHECK(x.scalar_type() == Form<P>::dtype && packed.scalar_type() == Form<P>::dtype && packed.is_contiguous(),
              name, ": ", Form<P>::element, " only, contiguous panels");
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0);
  TORCH_CHECK(M >= 1, name, ": no rows");
  TORCH_CHECK(N > (panels - 1) * OUT && N <= panels * OUT, name, GLU ? ": I" : ": N", " does not match the panels");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->is_contiguous() && bias->numel() == panels * NR && bias->scalar_type() == at::kFloat),
              name, ": bias must be fp32, laid out as the panels (", NR, " a panel)");
  x = x.contiguous();
  auto y = torch::empty({M, N}, x.options());
  const T *xp = (const T*)x.data_ptr(), *pp = (const T*)packed.data_ptr();
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  T* yp = (T*)y.data_ptr();
  const int64_t panel_size = packed.size(1) * NR * P::STEP;
  auto panel_rows = [&](int64_t p, int64_t m0, int64_t rows, bool more) {  // rows m0 .. m0 + rows - 1 of panel p
    const T* panel = pp + p * panel_size;
    (GLU ? PanelKernel<P>::glu_rows : PanelKernel<P>::rows)(
        xp + m0 * K, rows, K, panel, more ? panel + panel_size : nullptr, bp ? bp + p * NR : nullptr,
        yp + m0 * N + p * OUT, N, std::min(OUT, N - p * OUT));
  };
  if (M >= SCHEDULE_MIN_ROWS) {
    for_panel_chunks(M, (int64_t)sizeof(T) * K, P::MR, panels, panel_rows);
  } else {  // a thread's contiguous run of panels, each prefetching the next
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) panel_rows(p, 0, M, p + 1 < p1);
    });
  }
  return y;
}

}  // namespace

using Bias = c10::optional<torch::Tensor>;
torch::Tensor pack_panels(torch::Tensor w) { return pack<PanelsAvx2>("pack_panels", w); }
torch::Tensor pack_glu(torch::Tensor w) { return pack_glu<PanelsAvx2>("pack_glu", w); }
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor packed, Bias bias, int64_t N) {
  return run<PanelsAvx2, false>("panel_linear", x, packed, bias, N);
}
torch::Tensor panel_glu(torch::Tensor x, torch::Tensor packed, Bias bias, int64_t I) {
  return run<PanelsAvx2, true>("panel_glu", x, packed, bias, I);
}
torch::Tensor pack_panels512(torch::Tensor w) { return pack<PanelsAvx512>("pack_panels512", w); }
torch::Tensor pack_glu512(torch::Tensor w) { return pack_glu<PanelsAvx512>("pack_glu512", w); }
torch::Tensor panel_linear512(torch::Tensor x, torch::Tensor packed, Bias bias, int64_t N) {
  return run<PanelsAvx512, false>("panel_linear512", x, packed, bias, N);
}
torch::Tensor panel_glu512(torch::Tensor x, torch::Tensor packed, Bias bias, int64_t I) {
  return run<PanelsAvx512, true>("panel_glu512", x, packed, bias, I);
}
torch::Tensor pack_panels_bf16(torch::Tensor w) { return pack<PanelsAvx512Bf16>("pack_panels_bf16", w); }
torch::Tensor pack_glu_bf16(torch::Tensor w) { return pack_glu<PanelsAvx512Bf16>("pack_glu_bf16", w); }
torch::Tensor panel_linear_bf16(torch::Tensor x, torch::Tensor packed, Bias bias, int64_t N) {
  return run<PanelsAvx512Bf16, false>("panel_linear_bf16", x, packed, bias, N);
}
torch::Tensor panel_glu_bf16(torch::Tensor x, torch::Tensor packed, Bias bias, int64_t I) {
  return run<PanelsAvx512Bf16, true>("panel_glu_bf16", x, packed, bias, I);
}
