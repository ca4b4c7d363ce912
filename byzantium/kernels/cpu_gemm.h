// The panel linear, written once for PanelKernel's instantiations (cpu_kernels.h): fp32 on AVX2 (panels of
// 16 output columns, blocks of 6 rows), fp32 on AVX-512 (32 columns, 14 rows) and bf16 on avx512_bf16 (32
// columns of (k, k + 1) weight pairs, 14 rows; VDPBF16PS does 32 products where an fp32 FMA does 16, and
// the weights stream at half the bytes).
//
// y[m, n] = sum_k x[m, k] * w[n, k] + b[n], w repacked once into panels stored k-major (cpu_gemm.cpp), the
// layout of BLIS-style GEMM kernels. A decode step streams each layer's weights from memory, and oneDNN
// does not overlap that with its arithmetic (measured 102 GFLOP/s with the weights in cache, 57 streaming
// them): here a block of R rows x NR columns of y lives in 2R registers while a panel and R rows of x stream
// past, and the next panel is prefetched meanwhile, so memory and arithmetic overlap. Each output is one
// chain of FMAs (or dot products) over k in order, whatever the number of rows in the call, so a row's
// result does not depend on its batch. bf16: the fp32 sum (+ bias) rounded to bf16 once, to nearest even,
// as torch's bf16 linear does. GLU: a panel's gate and matching up columns side by side, and the block
// stores silu(gate) * up from the fp32 sums: the [M, 2I] product is never written (nor rounded).
#pragma once
#include "cpu_kernels.h"
#include "cpu_math.h"

// x[k] (fp32), or the bf16 pair x[k], x[k + 1] (x[K] read as 0), in every lane.
template <class V>
inline auto x_splat(const float* x, int64_t k, int64_t) { return V::splat(x + k); }
template <class V>
inline auto x_splat(const uint16_t* x, int64_t k, int64_t K) {
  if (k + 1 < K) return V::splat(x + k);
  const uint16_t last[2] = {x[k], 0};
  return V::splat(last);
}

// y[0:R, 0:cols] of one panel (+ bias), or silu(gate) * up (GLU). Named accumulators, not an array: with
// an array GCC kept all of them in sync with the stack on every k.
template <class P, int R, bool GLU>
void panel_block(const typename P::T* x, int64_t K, const typename P::T* panel, const typename P::T* next,
                 const float* bias, typename P::T* y, int64_t ldy, int64_t cols) {
  using V = typename P::V;
  using Vec = typename V::Vec;
  constexpr int64_t LINE = P::NR * P::STEP;  // a panel's elements per step of k: two vectors
  constexpr int W = V::W;
  Vec a0 = V::zero(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0, a4 = a0, b4 = a0, a5 = a0,
      b5 = a0, a6 = a0, b6 = a0, a7 = a0, b7 = a0, a8 = a0, b8 = a0, a9 = a0, b9 = a0, a10 = a0, b10 = a0, a11 = a0,
      b11 = a0, a12 = a0, b12 = a0, a13 = a0, b13 = a0;
  const int64_t steps = (K + P::STEP - 1) / P::STEP;
  for (int64_t s = 0; s < steps; ++s) {
    if (next)  // the next panel's cache lines of this step
      for (int64_t line = 0; line < LINE * (int64_t)sizeof(*panel); line += 64)
        _mm_prefetch((const char*)(next + s * LINE) + line, _MM_HINT_T0);
    const auto w0 = V::lanes(panel + s * LINE), w1 = V::lanes(panel + s * LINE + LINE / 2);
#define ROW(i)                                                  \
    if constexpr (R > i) {                                      \
      const auto xv = x_splat<V>(x + i * K, s * P::STEP, K);    \
      a##i = V::madd(a##i, xv, w0);                             \
      b##i = V::madd(b##i, xv, w1);                             \
    }
    ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11) ROW(12) ROW(13)
#undef ROW
  }
  const Vec bias_lo = bias ? V::load(bias) : V::zero(), bias_hi = bias ? V::load(bias + W) : V::zero();
  const int64_t n_lo = std::min<int64_t>(cols, W), n_hi = cols - W;  // the last panel's valid columns
#define STORE(i)                                                                                    \
  if constexpr (R > i) {                                                                            \
    const Vec lo = bias ? V::add(a##i, bias_lo) : a##i, hi = bias ? V::add(b##i, bias_hi) : b##i;   \
    if constexpr (GLU) {                                                                            \
      V::store_n(y + i * ldy, silu_mul<V>(lo, hi), n_lo);                                           \
    } else {                                                                                        \
      V::store_n(y + i * ldy, lo, n_lo);                                                            \
      V::store_n(y + i * ldy + W, hi, n_hi);                                                        \
    }                                                                                               \
  }
  STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5) STORE(6) STORE(7) STORE(8) STORE(9) STORE(10) STORE(11)
  STORE(12) STORE(13)
#undef STORE
}

// panel_block for a block of `rows` rows (1 .. MR), the row count a template argument.
template <class P, bool GLU, int R = P::MR, class... Args>
void panel_block_of(int64_t rows, Args... args) {
  if constexpr (R > 1)
    if (rows < R) return panel_block_of<P, GLU, R - 1>(rows, args...);
  panel_block<P, R, GLU>(args...);
}

// All M rows against one panel, MR at a time; the first block prefetches the next panel.
template <class P, bool GLU>
void panel_rows(const typename P::T* x, int64_t M, int64_t K, const typename P::T* panel, const typename P::T* next,
                const float* bias, typename P::T* y, int64_t ldy, int64_t cols) {
  for (int64_t m = 0; m < M; m += P::MR, next = nullptr)
    panel_block_of<P, GLU>(std::min<int64_t>(P::MR, M - m), x + m * K, K, panel, next, bias, y + m * ldy, ldy, cols);
}

template <class P>
void PanelKernel<P>::rows(const T* x, int64_t M, int64_t K, const T* panel, const T* next, const float* bias, T* y,
                          int64_t ldy, int64_t cols) {
  panel_rows<P, false>(x, M, K, panel, next, bias, y, ldy, cols);
}

template <class P>
void PanelKernel<P>::glu_rows(const T* x, int64_t M, int64_t K, const T* panel, const T* next, const float* bias,
                              T* y, int64_t ldy, int64_t cols) {
  panel_rows<P, true>(x, M, K, panel, next, bias, y, ldy, cols);
}
