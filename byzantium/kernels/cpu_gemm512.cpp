// The panel linear of cpu_gemm.cpp for CPUs with AVX-512: panels of 32 output columns (two 512-bit
// vectors, two cache lines per k) and blocks of up to 14 rows of x: 28 accumulators of the 32 registers.
//
// cpu_gemm.cpp's AVX2 kernel streams a decode step's weights faster than oneDNN here but, at half the
// vector width, loses at 32 rows and at prefill, where the arithmetic bounds it. This one is built into
// the same library with the AVX-512 code confined to the functions between the target pragmas, so the
// library still loads on an AVX2-only CPU; `avx512_supported` says whether it may be called (the linear
// choice times it against the others only then). Each output is one chain of FMAs over k in order,
// whatever the number of rows in the call, so a row's result does not depend on its batch.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include "cpu_panel_schedule.h"
#include "cpu_simd.h"

constexpr int64_t NR512 = 32;  // output columns per panel
constexpr int MR512 = 14;      // rows of x per block

#pragma GCC push_options
#pragma GCC target("avx512f")

// y[0:R, 0:32] of one panel = x[0:R, :] . panel (+ bias); `mask` selects the valid columns of the last,
// zero-padded panel. `next`: the panel to prefetch meanwhile, or null. GLU: the panel's low 16 columns
// are gate rows and its high 16 the matching up rows (pack_glu512), and y[0:R, 0:16] = silu(gate) * up.
template <int R, bool GLU = false>
static void block512(const float* x, int64_t K, const float* panel, const float* next, const float* bias, float* y,
                     int64_t ldy, __mmask16 mask_lo, __mmask16 mask_hi) {
  __m512 a0 = _mm512_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0, a4 = a0, b4 = a0,
         a5 = a0, b5 = a0, a6 = a0, b6 = a0, a7 = a0, b7 = a0, a8 = a0, b8 = a0, a9 = a0, b9 = a0, a10 = a0, b10 = a0,
         a11 = a0, b11 = a0, a12 = a0, b12 = a0, a13 = a0, b13 = a0;
  for (int64_t k = 0; k < K; ++k) {
    if (next) {
      _mm_prefetch((const char*)(next + k * NR512), _MM_HINT_T0);
      _mm_prefetch((const char*)(next + k * NR512 + 16), _MM_HINT_T0);
    }
    const __m512 w0 = _mm512_loadu_ps(panel + k * NR512), w1 = _mm512_loadu_ps(panel + k * NR512 + 16);
#define ROW(i)                                          \
    if constexpr (R > i) {                              \
      const __m512 xv = _mm512_set1_ps(x[i * K + k]);  \
      a##i = _mm512_fmadd_ps(xv, w0, a##i);             \
      b##i = _mm512_fmadd_ps(xv, w1, b##i);             \
    }
    ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11) ROW(12) ROW(13)
#undef ROW
  }
  const __m512 bias_lo = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  const __m512 bias_hi = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
#define STORE(i)                                                                                    \
  if constexpr (R > i) {                                                                            \
    const __m512 lo = bias ? _mm512_add_ps(a##i, bias_lo) : a##i, hi = bias ? _mm512_add_ps(b##i, bias_hi) : b##i; \
    if constexpr (GLU) {                                                                            \
      _mm512_mask_storeu_ps(y + i * ldy, mask_lo, silu_mul16(lo, hi));                              \
    } else {                                                                                        \
      _mm512_mask_storeu_ps(y + i * ldy, mask_lo, lo);                                              \
      _mm512_mask_storeu_ps(y + i * ldy + 16, mask_hi, hi);                                         \
    }                                                                                               \
  }
  STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5) STORE(6) STORE(7) STORE(8) STORE(9) STORE(10) STORE(11) STORE(12) STORE(13)
#undef STORE
}

// All M rows against one panel, fourteen at a time; the first block prefetches the next panel.
template <bool GLU = false>
static void panel_rows512(const float* x, int64_t M, int64_t K, const float* panel, const float* next,
                          const float* bias, float* y, int64_t N, int64_t cols) {
  const __mmask16 lo = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
  const __mmask16 hi = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
  for (int64_t m = 0; m < M; m += MR512, next = nullptr) {
    const float* xm = x + m * K;
    float* ym = y + m * N;
    switch (std::min<int64_t>(MR512, M - m)) {
      case 1: block512<1, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 2: block512<2, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 3: block512<3, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 4: block512<4, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 5: block512<5, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 6: block512<6, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 7: block512<7, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 8: block512<8, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 9: block512<9, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 10: block512<10, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 11: block512<11, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 12: block512<12, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      case 13: block512<13, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
      default: block512<14, GLU>(xm, K, panel, next, bias, ym, N, lo, hi); break;
    }
  }
}

#pragma GCC pop_options

bool avx512_supported() { return __builtin_cpu_supports("avx512f"); }

// w [N, K] -> [ceil(N / 32), K, 32], columns past N zero.
torch::Tensor pack_panels512(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "pack_panels512: fp32 [N, K] weight");
  const int64_t N = w.size(0), K = w.size(1), panels = (N + NR512 - 1) / NR512;
  auto padded = torch::zeros({panels * NR512, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  return padded.view({panels, NR512, K}).transpose(1, 2).contiguous();
}

// x [M, K] @ w.T + bias for w packed by pack_panels512; `bias`, when given, padded to whole panels (32 * P).
torch::Tensor panel_linear512(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t N) {
  TORCH_CHECK(avx512_supported(), "panel_linear512: this CPU has no AVX-512");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == NR512 && x.size(1) == packed.size(1),
              "panel_linear512: shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && packed.is_contiguous(),
              "panel_linear512: fp32 only, contiguous panels");
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0);
  TORCH_CHECK(M >= 1, "panel_linear512: no rows");
  TORCH_CHECK(N > (panels - 1) * NR512 && N <= panels * NR512, "panel_linear512: N does not match the panels");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->is_contiguous() && bias->numel() == panels * NR512 && bias->scalar_type() == at::kFloat),
              "panel_linear512: bias must be fp32, padded to 32 * panels");
  x = x.contiguous();
  auto y = torch::empty({M, N}, x.options());
  const float *xp = x.data_ptr<float>(), *pp = packed.data_ptr<float>();
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  if (M >= SCHEDULE_MIN_ROWS) {
    for_panel_chunks(M, 4 * K, MR512, panels, [&](int64_t p, int64_t m0, int64_t rows, bool more) {
      panel_rows512(xp + m0 * K, rows, K, pp + p * K * NR512, more ? pp + (p + 1) * K * NR512 : nullptr,
                    bp ? bp + p * NR512 : nullptr, yp + m0 * N + p * NR512, N, std::min(NR512, N - p * NR512));
    });
    return y;
  }
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      panel_rows512(xp, M, K, pp + p * K * NR512, p + 1 < p1 ? pp + (p + 1) * K * NR512 : nullptr,
                    bp ? bp + p * NR512 : nullptr, yp + p * NR512, N, std::min(NR512, N - p * NR512));
  });
  return y;
}

// Gate and up rows of a fused gate_up weight w [2I, K] as panel_glu512 reads them: panel p holds gate rows
// 16p .. 16p + 15 in its low half and up rows I + 16p .. in its high half (rows past I zero).
torch::Tensor pack_glu512(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.size(0) % 2 == 0, "pack_glu512: fp32 [2I, K] weight");
  const int64_t I = w.size(0) / 2, K = w.size(1), panels = (I + 15) / 16;
  auto gate = torch::zeros({panels * 16, K}, w.options()), up = torch::zeros({panels * 16, K}, w.options());
  gate.narrow(0, 0, I).copy_(w.narrow(0, 0, I));
  up.narrow(0, 0, I).copy_(w.narrow(0, I, I));
  auto interleaved = torch::cat({gate.view({panels, 16, K}), up.view({panels, 16, K})}, 1);  // [panels, 32, K]
  return interleaved.transpose(1, 2).contiguous();
}

// silu(x @ gate.T + bias_gate) * (x @ up.T + bias_up) [M, I] from panels of pack_glu512: the gate_up
// linear and the SiLU * up of an MLP in one pass, so the [M, 2I] product is never written out. `bias`,
// when given, laid out as the panels are (32 per panel: 16 gate, 16 up).
torch::Tensor panel_glu512(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t I) {
  TORCH_CHECK(avx512_supported(), "panel_glu512: this CPU has no AVX-512");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == NR512 && x.size(1) == packed.size(1),
              "panel_glu512: shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && packed.is_contiguous(),
              "panel_glu512: fp32 only, contiguous panels");
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0);
  TORCH_CHECK(M >= 1, "panel_glu512: no rows");
  TORCH_CHECK(I > (panels - 1) * 16 && I <= panels * 16, "panel_glu512: I does not match the panels");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->is_contiguous() && bias->numel() == panels * NR512 && bias->scalar_type() == at::kFloat),
              "panel_glu512: bias must be fp32, laid out as the panels");
  x = x.contiguous();
  auto y = torch::empty({M, I}, x.options());
  const float *xp = x.data_ptr<float>(), *pp = packed.data_ptr<float>();
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  if (M >= SCHEDULE_MIN_ROWS) {
    for_panel_chunks(M, 4 * K, MR512, panels, [&](int64_t p, int64_t m0, int64_t rows, bool more) {
      panel_rows512<true>(xp + m0 * K, rows, K, pp + p * K * NR512, more ? pp + (p + 1) * K * NR512 : nullptr,
                          bp ? bp + p * NR512 : nullptr, yp + m0 * I + p * 16, I, std::min<int64_t>(16, I - p * 16));
    });
    return y;
  }
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      panel_rows512<true>(xp, M, K, pp + p * K * NR512, p + 1 < p1 ? pp + (p + 1) * K * NR512 : nullptr,
                          bp ? bp + p * NR512 : nullptr, yp + p * 16, I, std::min<int64_t>(16, I - p * 16));
  });
  return y;
}
