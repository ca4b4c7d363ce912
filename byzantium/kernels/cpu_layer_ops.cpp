// The small fp32 operations of a decoder layer, each one pass over its rows (AVX2 + FMA): RMSNorm, SiLU(gate)
// * up, and the rotary embedding. In torch each is four to seven operators, every one a pass over memory
// and a dispatch; in a decode step of a few rows the dispatches cost more than the arithmetic, and in a
// prefill the passes do. Rows are independent, so a row's result does not depend on the others in the call.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include "cpu_simd.h"
#include <algorithm>
#include <cmath>
#include <tuple>

// Rows per thread below which a call stays on one thread (a decode step): a parallel region costs more.
constexpr int64_t GRAIN_FLOATS = 16384;

static int64_t grain(int64_t row_floats) { return std::max<int64_t>(1, GRAIN_FLOATS / std::max<int64_t>(1, row_floats)); }

// y = w * r / sqrt(mean(r^2) + eps) for one row r, the sum of squares in fp32 (as transformers computes it).
static inline void norm_row(const float* r, const float* w, float* y, int64_t H, float eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t h = 0;
  for (; h + 8 <= H; h += 8) {
    const __m256 v = _mm256_loadu_ps(r + h);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float squares = hsum(acc);
  for (; h < H; ++h) squares += r[h] * r[h];
  const float inv = 1.0f / std::sqrt(squares / H + eps);
  const __m256 invv = _mm256_set1_ps(inv);
  for (h = 0; h + 8 <= H; h += 8)
    _mm256_storeu_ps(y + h, _mm256_mul_ps(_mm256_loadu_ps(w + h), _mm256_mul_ps(_mm256_loadu_ps(r + h), invv)));
  for (; h < H; ++h) y[h] = w[h] * (r[h] * inv);
}

static void check_norm(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1, "rms_norm: fp32 rows [T, H]");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.numel() == x.size(1) && weight.is_contiguous(),
              "rms_norm: weight [H]");
}

// RMSNorm of rows x [T, H].
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  check_norm(x, weight);
  const int64_t T = x.size(0), H = x.size(1), ld = x.stride(0);
  auto out = torch::empty({T, H}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) norm_row(xp + t * ld, wp, op + t * H, H, (float)eps);
  });
  return out;
}

// The residual stream's add and the norm after it in one pass: r = x + residual (rounded as torch's add),
// returns (RMSNorm(r), r).
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                                      double eps) {
  check_norm(x, weight);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == at::kFloat && residual.stride(1) == 1,
              "add_rms_norm: residual like x");
  const int64_t T = x.size(0), H = x.size(1), ldx = x.stride(0), ldr = residual.stride(0);
  auto out = torch::empty({T, H}, x.options());
  auto sum = torch::empty({T, H}, x.options());
  const float *xp = x.data_ptr<float>(), *rp = residual.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float *op = out.data_ptr<float>(), *sp = sum.data_ptr<float>();
  at::parallel_for(0, T, grain(2 * H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *a = xp + t * ldx, *b = rp + t * ldr;
      float* r = sp + t * H;
      int64_t h = 0;
      for (; h + 8 <= H; h += 8) _mm256_storeu_ps(r + h, _mm256_add_ps(_mm256_loadu_ps(a + h), _mm256_loadu_ps(b + h)));
      for (; h < H; ++h) r[h] = a[h] + b[h];
      norm_row(r, wp, op + t * H, H, (float)eps);
    }
  });
  return {out, sum};
}

// gate_up [T, 2I] (gate, then up) -> silu(gate) * up [T, I].
torch::Tensor silu_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kFloat && gate_up.stride(1) == 1 &&
              gate_up.size(1) % 2 == 0, "silu_mul: fp32 rows [T, 2I]");
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2, ld = gate_up.stride(0);
  auto out = torch::empty({T, I}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, grain(3 * I), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *g = gp + t * ld, *u = g + I;
      float* y = op + t * I;
      int64_t i = 0;
      for (; i + 8 <= I; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
      for (; i < I; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
  return out;
}

// Rotary embedding of x [T, H, D] (heads contiguous, any row stride) with cos = cat(c, c) and
// signed_sin = cat(-s, s), each [T, D]: out = x * cos + roll(x, D / 2) * signed_sin, contiguous.
torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor signed_sin) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.stride(2) == 1 && x.stride(1) == x.size(2) &&
              x.size(2) % 2 == 0, "rope: fp32 [T, H, D] with contiguous heads");
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), half = D / 2, ld = x.stride(0);
  TORCH_CHECK(cos.scalar_type() == at::kFloat && signed_sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              signed_sin.is_contiguous() && cos.numel() == T * D && signed_sin.numel() == T * D, "rope: tables [T, D]");
  auto out = torch::empty({T, H, D}, x.options());
  const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = signed_sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, grain(H * D), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *c = cp + t * D, *s = sp + t * D;
      for (int64_t h = 0; h < H; ++h) {
        const float* v = xp + t * ld + h * D;
        float* y = op + (t * H + h) * D;
        int64_t i = 0;
        for (; i + 8 <= half; i += 8) {
          const __m256 lo = _mm256_loadu_ps(v + i), hi = _mm256_loadu_ps(v + half + i);
          _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_mul_ps(lo, _mm256_loadu_ps(c + i)),
                                                _mm256_mul_ps(hi, _mm256_loadu_ps(s + i))));
          _mm256_storeu_ps(y + half + i, _mm256_add_ps(_mm256_mul_ps(hi, _mm256_loadu_ps(c + half + i)),
                                                       _mm256_mul_ps(lo, _mm256_loadu_ps(s + half + i))));
        }
        for (; i < half; ++i) {
          y[i] = v[i] * c[i] + v[half + i] * s[i];
          y[half + i] = v[half + i] * c[half + i] + v[i] * s[half + i];
        }
      }
    }
  });
  return out;
}
