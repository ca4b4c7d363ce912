// fp32 linear for batches of a few dozen rows (a decode step of many sequences) on AVX2 + FMA CPUs:
// y[m, n] = sum_k x[m, k] * w[n, k] + b[n], with w repacked once into panels of 16 output columns
// stored k-major (`pack_panels`: [N/16, K, 16]), the layout of BLIS-style GEMM kernels.
//
// At 32 rows a step is bound by arithmetic once the weights are in cache, but a model's weights are not:
// each layer's come from memory once per step, and oneDNN does not overlap that with its arithmetic
// (measured 102 GFLOP/s with the weights in cache, 57 streaming them). Here a 6x16 block of y lives in
// twelve registers while a panel (one cache line per k) and six rows of x stream past, and while one panel
// is being worked on the next one is prefetched, a line per k, so memory and arithmetic overlap.
// Prefill-sized products share (row chunk, panels) units between the threads (cpu_panel_schedule.h), and
// the gate_up linear of an MLP can run with SiLU * up in the same pass (panel_glu).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include "cpu_panel_schedule.h"
#include "cpu_simd.h"

constexpr int64_t NR = 16;  // output columns per panel: two AVX2 vectors, 64 bytes per k
constexpr int MR = 6;       // rows of x per block: 12 accumulators, leaving registers for the panel

static inline void store_row(__m256 lo, __m256 hi, const float* bias, float* y, int64_t cols) {
  if (bias) {
    lo = _mm256_add_ps(lo, _mm256_loadu_ps(bias));
    hi = _mm256_add_ps(hi, _mm256_loadu_ps(bias + 8));
  }
  if (cols == NR) {
    _mm256_storeu_ps(y, lo);
    _mm256_storeu_ps(y + 8, hi);
    return;
  }
  float tile[NR];
  _mm256_storeu_ps(tile, lo);
  _mm256_storeu_ps(tile + 8, hi);
  std::copy(tile, tile + cols, y);
}

// The GLU form of store_row: the panel's low 8 columns are gate, its high 8 the matching up (pack_glu), and
// y[0:cols] = silu(gate) * up, as silu_mul computes it from the unfused product.
static inline void store_glu(__m256 gate, __m256 up, const float* bias, float* y, int64_t cols) {
  if (bias) {
    gate = _mm256_add_ps(gate, _mm256_loadu_ps(bias));
    up = _mm256_add_ps(up, _mm256_loadu_ps(bias + 8));
  }
  const __m256 out = _mm256_mul_ps(silu8(gate), up);
  if (cols == 8) {
    _mm256_storeu_ps(y, out);
    return;
  }
  float tile[8];
  _mm256_storeu_ps(tile, out);
  std::copy(tile, tile + cols, y);
}

// y[0:R, 0:16] of one panel = x[0:R, :] . panel (+ bias); `cols` < 16 only for the last, zero-padded
// panel. `next`: the panel to prefetch meanwhile, or null. Named accumulators, not an array: with an array
// GCC kept all twelve in sync with the stack on every k. GLU: y[0:R, 0:cols] = silu(gate) * up (store_glu).
template <int R, bool GLU = false>
static void block(const float* x, int64_t K, const float* panel, const float* next, const float* bias, float* y,
                  int64_t ldy, int64_t cols) {
  __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0, a4 = a0,
         b4 = a0, a5 = a0, b5 = a0;
  for (int64_t k = 0; k < K; ++k) {
    if (next) _mm_prefetch((const char*)(next + k * NR), _MM_HINT_T0);
    const __m256 w0 = _mm256_loadu_ps(panel + k * NR), w1 = _mm256_loadu_ps(panel + k * NR + 8);
#define ROW(i)                                               \
    if constexpr (R > i) {                                   \
      const __m256 xv = _mm256_broadcast_ss(x + i * K + k); \
      a##i = _mm256_fmadd_ps(xv, w0, a##i);                  \
      b##i = _mm256_fmadd_ps(xv, w1, b##i);                  \
    }
    ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
#undef ROW
  }
  constexpr auto store = GLU ? store_glu : store_row;
  store(a0, b0, bias, y, cols);
  if constexpr (R > 1) store(a1, b1, bias, y + ldy, cols);
  if constexpr (R > 2) store(a2, b2, bias, y + 2 * ldy, cols);
  if constexpr (R > 3) store(a3, b3, bias, y + 3 * ldy, cols);
  if constexpr (R > 4) store(a4, b4, bias, y + 4 * ldy, cols);
  if constexpr (R > 5) store(a5, b5, bias, y + 5 * ldy, cols);
}

// All M rows against one panel, six at a time; the first block prefetches the next panel.
template <bool GLU = false>
static void panel_rows(const float* x, int64_t M, int64_t K, const float* panel, const float* next,
                       const float* bias, float* y, int64_t N, int64_t cols) {
  for (int64_t m = 0; m < M; m += MR, next = nullptr) {
    const float* xm = x + m * K;
    float* ym = y + m * N;
    switch (std::min<int64_t>(MR, M - m)) {
      case 1: block<1, GLU>(xm, K, panel, next, bias, ym, N, cols); break;
      case 2: block<2, GLU>(xm, K, panel, next, bias, ym, N, cols); break;
      case 3: block<3, GLU>(xm, K, panel, next, bias, ym, N, cols); break;
      case 4: block<4, GLU>(xm, K, panel, next, bias, ym, N, cols); break;
      case 5: block<5, GLU>(xm, K, panel, next, bias, ym, N, cols); break;
      default: block<6, GLU>(xm, K, panel, next, bias, ym, N, cols); break;
    }
  }
}

// w [N, K] -> [ceil(N / 16), K, 16], columns past N zero.
torch::Tensor pack_panels(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "pack_panels: fp32 [N, K] weight");
  const int64_t N = w.size(0), K = w.size(1), panels = (N + NR - 1) / NR;
  auto padded = torch::zeros({panels * NR, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  return padded.view({panels, NR, K}).transpose(1, 2).contiguous();
}

// x [M, K] @ w.T + bias for w packed by pack_panels; `bias`, when given, padded to whole panels (16 * P).
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == NR && x.size(1) == packed.size(1),
              "panel_linear: shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && packed.is_contiguous(),
              "panel_linear: fp32 only, contiguous panels");
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0);
  TORCH_CHECK(M >= 1, "panel_linear: no rows");
  TORCH_CHECK(N > (panels - 1) * NR && N <= panels * NR, "panel_linear: N does not match the panels");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->is_contiguous() && bias->numel() == panels * NR && bias->scalar_type() == at::kFloat),
              "panel_linear: bias must be fp32, padded to 16 * panels");
  x = x.contiguous();
  auto y = torch::empty({M, N}, x.options());
  const float *xp = x.data_ptr<float>(), *pp = packed.data_ptr<float>();
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  if (M >= SCHEDULE_MIN_ROWS) {
    for_panel_chunks(M, 4 * K, MR, panels, [&](int64_t p, int64_t m0, int64_t rows, bool more) {
      panel_rows(xp + m0 * K, rows, K, pp + p * K * NR, more ? pp + (p + 1) * K * NR : nullptr,
                 bp ? bp + p * NR : nullptr, yp + m0 * N + p * NR, N, std::min(NR, N - p * NR));
    });
    return y;
  }
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      panel_rows(xp, M, K, pp + p * K * NR, p + 1 < p1 ? pp + (p + 1) * K * NR : nullptr, bp ? bp + p * NR : nullptr,
                 yp + p * NR, N, std::min(NR, N - p * NR));
  });
  return y;
}

// Gate and up rows of a fused gate_up weight w [2I, K] as panel_glu reads them: panel p holds gate rows
// 8p .. 8p + 7 in its low half and up rows I + 8p .. in its high half (rows past I zero).
torch::Tensor pack_glu(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.size(0) % 2 == 0, "pack_glu: fp32 [2I, K] weight");
  const int64_t I = w.size(0) / 2, K = w.size(1), panels = (I + 7) / 8;
  auto gate = torch::zeros({panels * 8, K}, w.options()), up = torch::zeros({panels * 8, K}, w.options());
  gate.narrow(0, 0, I).copy_(w.narrow(0, 0, I));
  up.narrow(0, 0, I).copy_(w.narrow(0, I, I));
  auto interleaved = torch::cat({gate.view({panels, 8, K}), up.view({panels, 8, K})}, 1);  // [panels, 16, K]
  return interleaved.transpose(1, 2).contiguous();
}

// silu(x @ gate.T + bias_gate) * (x @ up.T + bias_up) [M, I] from panels of pack_glu: the gate_up linear
// and the SiLU * up of an MLP in one pass, so the [M, 2I] product is never written out. `bias`, when
// given, laid out as the panels are (16 per panel: 8 gate, 8 up).
torch::Tensor panel_glu(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t I) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == NR && x.size(1) == packed.size(1),
              "panel_glu: shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && packed.is_contiguous(),
              "panel_glu: fp32 only, contiguous panels");
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0);
  TORCH_CHECK(M >= 1, "panel_glu: no rows");
  TORCH_CHECK(I > (panels - 1) * 8 && I <= panels * 8, "panel_glu: I does not match the panels");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->is_contiguous() && bias->numel() == panels * NR && bias->scalar_type() == at::kFloat),
              "panel_glu: bias must be fp32, laid out as the panels");
  x = x.contiguous();
  auto y = torch::empty({M, I}, x.options());
  const float *xp = x.data_ptr<float>(), *pp = packed.data_ptr<float>();
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  if (M >= SCHEDULE_MIN_ROWS) {
    for_panel_chunks(M, 4 * K, MR, panels, [&](int64_t p, int64_t m0, int64_t rows, bool more) {
      panel_rows<true>(xp + m0 * K, rows, K, pp + p * K * NR, more ? pp + (p + 1) * K * NR : nullptr,
                       bp ? bp + p * NR : nullptr, yp + m0 * I + p * 8, I, std::min<int64_t>(8, I - p * 8));
    });
    return y;
  }
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      panel_rows<true>(xp, M, K, pp + p * K * NR, p + 1 < p1 ? pp + (p + 1) * K * NR : nullptr,
                       bp ? bp + p * NR : nullptr, yp + p * 8, I, std::min<int64_t>(8, I - p * 8));
  });
  return y;
}
