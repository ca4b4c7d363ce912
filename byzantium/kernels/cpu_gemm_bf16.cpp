// The panel linear for bf16 models on CPUs with avx512_bf16 (AMD Zen 4/5, Intel Cooper Lake, Sapphire
// Rapids and later): VDPBF16PS multiplies bf16 pairs and accumulates them in fp32, 32 products an
// instruction against 16 for an fp32 FMA, and the weights stream at half the bytes.
//
// A panel is 32 output columns; for each pair of inputs (k, k + 1) it holds the 32 columns' two weights
// side by side (one 32-bit lane = one column's pair), so a row of x contributes one broadcast 32-bit pair
// per k-pair. Blocks of up to 14 rows (28 accumulators). Each output is one chain over the k-pairs in
// order, whatever the number of rows in the call: a row's result does not depend on its batch. The fp32
// sum (+ bias) is rounded to bf16 once, to nearest even, as torch's bf16 linear does.
//
// An MLP's gate_up linear can end in SiLU * up (GLU): as in cpu_gemm512.cpp, a panel then holds 16 gate
// and the 16 matching up columns, and the block stores silu(gate) * up from the fp32 sums, so the [M, 2I]
// product is never written (nor rounded to bf16 before the SiLU).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include "cpu_panel_schedule.h"
#include "cpu_simd.h"

constexpr int64_t NRB = 32;  // output columns per panel
constexpr int MRB = 14;      // rows of x per block

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

// The (k, k + 1) pair of a bf16 row as one 32-bit lane (k + 1 past the end reads as 0).
static inline int32_t pair_at(const uint16_t* x, int64_t k, int64_t K) {
  if (k + 1 < K) {
    int32_t v;
    std::memcpy(&v, x + k, 4);
    return v;
  }
  return (int32_t)x[k];
}

static inline void store_bf16(uint16_t* y, __m512 v, __mmask16 mask) {
  _mm256_mask_storeu_epi16(y, mask, (__m256i)_mm512_cvtneps_pbh(v));
}

// y[0:R, 0:32] of one panel = x[0:R, :] . panel (+ bias), for KP k-pairs; GLU: y[0:R, 0:16] = silu(low 16
// columns) * high 16.
template <int R, bool GLU = false>
static void block_bf16(const uint16_t* x, int64_t K, int64_t KP, const uint16_t* panel, const uint16_t* next,
                       const float* bias, uint16_t* y, int64_t ldy, __mmask16 mask_lo, __mmask16 mask_hi) {
  __m512 a0 = _mm512_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0, a4 = a0, b4 = a0,
         a5 = a0, b5 = a0, a6 = a0, b6 = a0, a7 = a0, b7 = a0, a8 = a0, b8 = a0, a9 = a0, b9 = a0, a10 = a0, b10 = a0,
         a11 = a0, b11 = a0, a12 = a0, b12 = a0, a13 = a0, b13 = a0;
  for (int64_t p = 0; p < KP; ++p) {
    const uint16_t* w = panel + p * 2 * NRB;  // 32 columns x 2 = 64 bf16 = two vectors
    if (next) {  // both cache lines of the next panel's k-pair row (64 bf16 = 128 bytes)
      _mm_prefetch((const char*)(next + p * 2 * NRB), _MM_HINT_T0);
      _mm_prefetch((const char*)(next + p * 2 * NRB + NRB), _MM_HINT_T0);
    }
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w), w1 = (__m512bh)_mm512_loadu_si512(w + NRB);
#define ROW(i)                                                                       \
    if constexpr (R > i) {                                                           \
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair_at(x + i * K, 2 * p, K)); \
      a##i = _mm512_dpbf16_ps(a##i, xv, w0);                                          \
      b##i = _mm512_dpbf16_ps(b##i, xv, w1);                                          \
    }
    ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11) ROW(12) ROW(13)
#undef ROW
  }
  const __m512 bias_lo = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  const __m512 bias_hi = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
#define STORE(i)                                                                                     \
  if constexpr (R > i) {                                                                             \
    const __m512 lo = bias ? _mm512_add_ps(a##i, bias_lo) : a##i, hi = bias ? _mm512_add_ps(b##i, bias_hi) : b##i; \
    if constexpr (GLU) {                                                                             \
      store_bf16(y + i * ldy, silu_mul16(lo, hi), mask_lo);                                          \
    } else {                                                                                         \
      store_bf16(y + i * ldy, lo, mask_lo);                                                          \
      store_bf16(y + i * ldy + 16, hi, mask_hi);                                                     \
    }                                                                                                \
  }
  STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5) STORE(6) STORE(7) STORE(8) STORE(9) STORE(10) STORE(11) STORE(12) STORE(13)
#undef STORE
}

// All M rows against one panel, fourteen at a time; the first block prefetches the next panel.
template <bool GLU = false>
static void panel_rows_bf16(const uint16_t* x, int64_t M, int64_t K, const uint16_t* panel, const uint16_t* next,
                            const float* bias, uint16_t* y, int64_t N, int64_t cols) {
  const int64_t KP = (K + 1) / 2;
  const __mmask16 lo = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
  const __mmask16 hi = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
  for (int64_t m = 0; m < M; m += MRB, next = nullptr) {
    const uint16_t* xm = x + m * K;
    uint16_t* ym = y + m * N;
    switch (std::min<int64_t>(MRB, M - m)) {
      case 1: block_bf16<1, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 2: block_bf16<2, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 3: block_bf16<3, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 4: block_bf16<4, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 5: block_bf16<5, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 6: block_bf16<6, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 7: block_bf16<7, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 8: block_bf16<8, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 9: block_bf16<9, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 10: block_bf16<10, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 11: block_bf16<11, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 12: block_bf16<12, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      case 13: block_bf16<13, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
      default: block_bf16<14, GLU>(xm, K, KP, panel, next, bias, ym, N, lo, hi); break;
    }
  }
}

#pragma GCC pop_options

bool avx512_bf16_supported() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"); }

// w [N, K] bf16 -> [ceil(N / 32), ceil(K / 2), 32, 2]: per panel and k-pair, each column's (k, k + 1)
// weights side by side; columns past N and the k past an odd K are zero.
torch::Tensor pack_panels_bf16(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16, "pack_panels_bf16: bf16 [N, K] weight");
  const int64_t N = w.size(0), K = w.size(1), panels = (N + NRB - 1) / NRB, KP = (K + 1) / 2;
  auto padded = torch::zeros({panels * NRB, KP * 2}, w.options());
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(w);
  return padded.view({panels, NRB, KP, 2}).permute({0, 2, 1, 3}).contiguous();
}

// x [M, K] @ w.T + bias in bf16 for w packed by pack_panels_bf16; `bias`, when given, fp32 padded to whole
// panels (32 * P).
torch::Tensor panel_linear_bf16(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t N) {
  TORCH_CHECK(avx512_bf16_supported(), "panel_linear_bf16: this CPU has no avx512_bf16");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 4 && packed.size(2) == NRB && packed.size(3) == 2 &&
              packed.size(1) == (x.size(1) + 1) / 2, "panel_linear_bf16: shapes");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "panel_linear_bf16: bf16 only, contiguous panels");
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0);
  TORCH_CHECK(M >= 1, "panel_linear_bf16: no rows");
  TORCH_CHECK(N > (panels - 1) * NRB && N <= panels * NRB, "panel_linear_bf16: N does not match the panels");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->is_contiguous() && bias->numel() == panels * NRB && bias->scalar_type() == at::kFloat),
              "panel_linear_bf16: bias must be fp32, padded to 32 * panels");
  x = x.contiguous();
  auto y = torch::empty({M, N}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* pp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const int64_t panel_size = packed.size(1) * NRB * 2;
  if (M >= SCHEDULE_MIN_ROWS) {
    for_panel_chunks(M, 2 * K, MRB, panels, [&](int64_t p, int64_t m0, int64_t rows, bool more) {
      panel_rows_bf16(xp + m0 * K, rows, K, pp + p * panel_size, more ? pp + (p + 1) * panel_size : nullptr,
                      bp ? bp + p * NRB : nullptr, yp + m0 * N + p * NRB, N, std::min(NRB, N - p * NRB));
    });
    return y;
  }
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      panel_rows_bf16(xp, M, K, pp + p * panel_size, p + 1 < p1 ? pp + (p + 1) * panel_size : nullptr,
                      bp ? bp + p * NRB : nullptr, yp + p * NRB, N, std::min(NRB, N - p * NRB));
  });
  return y;
}

// A fused gate_up weight w [2I, K] (bf16) as panel_glu_bf16 reads it: panel p holds gate rows 16p .. 16p + 15
// as its low 16 columns and up rows I + 16p .. as its high 16, paired along k as pack_panels_bf16 does.
torch::Tensor pack_glu_bf16(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.size(0) % 2 == 0,
              "pack_glu_bf16: bf16 [2I, K] weight");
  const int64_t I = w.size(0) / 2, K = w.size(1), panels = (I + 15) / 16;
  auto gate = torch::zeros({panels * 16, K}, w.options()), up = torch::zeros({panels * 16, K}, w.options());
  gate.narrow(0, 0, I).copy_(w.narrow(0, 0, I));
  up.narrow(0, 0, I).copy_(w.narrow(0, I, I));
  return pack_panels_bf16(torch::cat({gate.view({panels, 16, K}), up.view({panels, 16, K})}, 1).view({panels * NRB, K}));
}

// silu(x @ gate.T + bias_gate) * (x @ up.T + bias_up) [M, I] in bf16 from panels of pack_glu_bf16; `bias`,
// when given, fp32 laid out as the panels are (32 per panel: 16 gate, 16 up).
torch::Tensor panel_glu_bf16(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t I) {
  TORCH_CHECK(avx512_bf16_supported(), "panel_glu_bf16: this CPU has no avx512_bf16");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 4 && packed.size(2) == NRB && packed.size(3) == 2 &&
              packed.size(1) == (x.size(1) + 1) / 2, "panel_glu_bf16: shapes");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "panel_glu_bf16: bf16 only, contiguous panels");
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0);
  TORCH_CHECK(M >= 1, "panel_glu_bf16: no rows");
  TORCH_CHECK(I > (panels - 1) * 16 && I <= panels * 16, "panel_glu_bf16: I does not match the panels");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->is_contiguous() && bias->numel() == panels * NRB && bias->scalar_type() == at::kFloat),
              "panel_glu_bf16: bias must be fp32, laid out as the panels");
  x = x.contiguous();
  auto y = torch::empty({M, I}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* pp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const int64_t panel_size = packed.size(1) * NRB * 2;
  if (M >= SCHEDULE_MIN_ROWS) {
    for_panel_chunks(M, 2 * K, MRB, panels, [&](int64_t p, int64_t m0, int64_t rows, bool more) {
      panel_rows_bf16<true>(xp + m0 * K, rows, K, pp + p * panel_size, more ? pp + (p + 1) * panel_size : nullptr,
                            bp ? bp + p * NRB : nullptr, yp + m0 * I + p * 16, I, std::min<int64_t>(16, I - p * 16));
    });
    return y;
  }
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      panel_rows_bf16<true>(xp, M, K, pp + p * panel_size, p + 1 < p1 ? pp + (p + 1) * panel_size : nullptr,
                            bp ? bp + p * NRB : nullptr, yp + p * 16, I, std::min<int64_t>(16, I - p * 16));
  });
  return y;
}
