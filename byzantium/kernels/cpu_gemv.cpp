// Small-batch fp32 linear for x86 CPUs with AVX2 + FMA: y[m, n] = sum_k x[m, k] * w[n, k] + b[n].
//
// A decode step at small batch is bound by reading the weights from memory once. General GEMM
// libraries reach only about half the machine's read bandwidth on these shapes; here each weight row
// is streamed once, used for every row of x, and the rows are split across torch's own thread pool.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>

// M rows of x (1..8) against one weight row: out[m] = x[m, :] . wr. Small M keeps two accumulators per
// row so that consecutive FMAs do not wait on each other.
template <int M>
static inline void dot_rows(const float* x, const float* wr, int64_t K, float* out) {
  constexpr int U = M <= 4 ? 2 : 1;
  __m256 acc[M][U];
  for (int m = 0; m < M; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 * U <= K; k += 8 * U) {
    for (int u = 0; u < U; ++u) {
      __m256 wv = _mm256_loadu_ps(wr + k + 8 * u);
      for (int m = 0; m < M; ++m) acc[m][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * K + k + 8 * u), acc[m][u]);
    }
  }
  for (int m = 0; m < M; ++m) {
    __m256 s = acc[m][0];
    if (U == 2) s = _mm256_add_ps(s, acc[m][U - 1]);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_hadd_ps(h, h);
    h = _mm_hadd_ps(h, h);
    float v = _mm_cvtss_f32(h);
    for (int64_t kk = k; kk < K; ++kk) v += x[m * K + kk] * wr[kk];  // K not a multiple of the step
    out[m] = v;
  }
}

// Weight rows n0..n1: each is read from memory once and, while it sits in L1, meets every row of x.
static void rows(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t K, int64_t N,
                 int64_t n0, int64_t n1) {
  float out[8];
  for (int64_t n = n0; n < n1; ++n) {
    const float* wr = w + n * K;
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
      const float* xm = x + m0 * K;
      const int mc = (int)std::min<int64_t>(8, M - m0);
      switch (mc) {
        case 1: dot_rows<1>(xm, wr, K, out); break;
        case 2: dot_rows<2>(xm, wr, K, out); break;
        case 3: dot_rows<3>(xm, wr, K, out); break;
        case 4: dot_rows<4>(xm, wr, K, out); break;
        case 5: dot_rows<5>(xm, wr, K, out); break;
        case 6: dot_rows<6>(xm, wr, K, out); break;
        case 7: dot_rows<7>(xm, wr, K, out); break;
        default: dot_rows<8>(xm, wr, K, out); break;
      }
      for (int m = 0; m < mc; ++m) y[(m0 + m) * N + n] = b ? out[m] + b[n] : out[m];
    }
  }
}

torch::Tensor small_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "small_linear: shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "small_linear: fp32 only");
  TORCH_CHECK(x.size(0) >= 1, "small_linear: no rows");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->contiguous();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { rows(xp, wp, bp, yp, M, K, N, n0, n1); });
  return y;
}

