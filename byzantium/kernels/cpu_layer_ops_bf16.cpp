// cpu_layer_ops.cpp's RMSNorm (with the residual add before it) and rotary embedding for bf16 rows, on CPUs
// with avx512_bf16 (its round-to-nearest-even conversion). In torch each is four to seven bf16 operators,
// every one a pass over memory and a dispatch: in a bf16 prefill the norms and rope cost a tenth of the
// step, in a decode step the dispatches alone a few milliseconds. The arithmetic is fp32; what torch rounds
// to bf16 between operators is rounded at the same points (norm: the normalised row before the weight,
// then the product; the residual sum), so results match the torch formula up to the fp32 sum's order.
// Rope rounds once (torch rounds each product and the sum). Rows are independent.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <tuple>

bool avx512_bf16_supported();

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

static inline __mmask16 tail(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

static inline __m512 load16(const at::BFloat16* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

static inline __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

static inline __m512 round_bf16(__m512 v) {  // v rounded to bf16, as fp32
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(v)), 16));
}

static inline void store16(at::BFloat16* p, __m512 v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, to_bf16(v)); }

// y = bf16(w * bf16(r / sqrt(mean(r^2) + eps))) for one bf16 row r; the sum of squares in fp32.
static void norm_row_bf16(const at::BFloat16* r, const at::BFloat16* w, at::BFloat16* y, int64_t H, float eps) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t h = 0; h < H; h += 16) {
    const __m512 v = load16(r + h, tail(H - h));
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / H + eps));
  for (int64_t h = 0; h < H; h += 16) {
    const __mmask16 m = tail(H - h);
    store16(y + h, _mm512_mul_ps(load16(w + h, m), round_bf16(_mm512_mul_ps(load16(r + h, m), inv))), m);
  }
}

static void sum_row_bf16(const at::BFloat16* a, const at::BFloat16* b, at::BFloat16* r, int64_t H) {
  for (int64_t h = 0; h < H; h += 16) {
    const __mmask16 m = tail(H - h);
    store16(r + h, _mm512_add_ps(load16(a + h, m), load16(b + h, m)), m);
  }
}

// out[0:half] = x_lo * c_lo + x_hi * s_lo, out[half:D] = x_hi * c_hi + x_lo * s_hi for one head.
static void rope_head_bf16(const at::BFloat16* v, const at::BFloat16* c, const at::BFloat16* s, at::BFloat16* y,
                           int64_t half) {
  for (int64_t i = 0; i < half; i += 16) {
    const __mmask16 m = tail(half - i);
    const __m512 lo = load16(v + i, m), hi = load16(v + half + i, m);
    store16(y + i, _mm512_fmadd_ps(lo, load16(c + i, m), _mm512_mul_ps(hi, load16(s + i, m))), m);
    store16(y + half + i, _mm512_fmadd_ps(hi, load16(c + half + i, m), _mm512_mul_ps(lo, load16(s + half + i, m))), m);
  }
}

#pragma GCC pop_options

static int64_t grain(int64_t row_elements) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_elements)); }

static void check_norm_bf16(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(avx512_bf16_supported(), "rms_norm_bf16: this CPU has no avx512_bf16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1, "rms_norm_bf16: bf16 rows [T, H]");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.numel() == x.size(1) && weight.is_contiguous(),
              "rms_norm_bf16: bf16 weight [H]");
}

// RMSNorm of bf16 rows x [T, H].
torch::Tensor rms_norm_bf16(torch::Tensor x, torch::Tensor weight, double eps) {
  check_norm_bf16(x, weight);
  const int64_t T = x.size(0), H = x.size(1), ld = x.stride(0);
  auto out = torch::empty({T, H}, x.options());
  const auto *xp = x.data_ptr<at::BFloat16>(), *wp = weight.data_ptr<at::BFloat16>();
  auto* op = out.data_ptr<at::BFloat16>();
  at::parallel_for(0, T, grain(H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) norm_row_bf16(xp + t * ld, wp, op + t * H, H, (float)eps);
  });
  return out;
}

// r = x + residual (rounded to bf16, as torch's add); returns (RMSNorm(r), r).
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm_bf16(torch::Tensor x, torch::Tensor residual,
                                                           torch::Tensor weight, double eps) {
  check_norm_bf16(x, weight);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == at::kBFloat16 && residual.stride(1) == 1,
              "add_rms_norm_bf16: residual like x");
  const int64_t T = x.size(0), H = x.size(1), ldx = x.stride(0), ldr = residual.stride(0);
  auto out = torch::empty({T, H}, x.options());
  auto sum = torch::empty({T, H}, x.options());
  const auto *xp = x.data_ptr<at::BFloat16>(), *rp = residual.data_ptr<at::BFloat16>(),
             *wp = weight.data_ptr<at::BFloat16>();
  auto *op = out.data_ptr<at::BFloat16>(), *sp = sum.data_ptr<at::BFloat16>();
  at::parallel_for(0, T, grain(2 * H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      sum_row_bf16(xp + t * ldx, rp + t * ldr, sp + t * H, H);
      norm_row_bf16(sp + t * H, wp, op + t * H, H, (float)eps);
    }
  });
  return {out, sum};
}

// Rotary embedding of bf16 x [T, H, D] (heads contiguous, any row stride) with bf16 tables cos = cat(c, c)
// and signed_sin = cat(-s, s), each [T, D]: out = x * cos + roll(x, D / 2) * signed_sin, contiguous.
torch::Tensor rope_bf16(torch::Tensor x, torch::Tensor cos, torch::Tensor signed_sin) {
  TORCH_CHECK(avx512_bf16_supported(), "rope_bf16: this CPU has no avx512_bf16");
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kBFloat16 && x.stride(2) == 1 && x.stride(1) == x.size(2) &&
              x.size(2) % 2 == 0, "rope_bf16: bf16 [T, H, D] with contiguous heads");
  const int64_t T = x.size(0), H = x.size(1), D = x.size(2), ld = x.stride(0);
  TORCH_CHECK(cos.scalar_type() == at::kBFloat16 && signed_sin.scalar_type() == at::kBFloat16 && cos.is_contiguous() &&
              signed_sin.is_contiguous() && cos.numel() == T * D && signed_sin.numel() == T * D,
              "rope_bf16: bf16 tables [T, D]");
  auto out = torch::empty({T, H, D}, x.options());
  const auto *xp = x.data_ptr<at::BFloat16>(), *cp = cos.data_ptr<at::BFloat16>(),
             *sp = signed_sin.data_ptr<at::BFloat16>();
  auto* op = out.data_ptr<at::BFloat16>();
  at::parallel_for(0, T, grain(H * D), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t h = 0; h < H; ++h) rope_head_bf16(xp + t * ld + h * D, cp + t * D, sp + t * D, op + (t * H + h) * D, D / 2);
  });
  return out;
}
