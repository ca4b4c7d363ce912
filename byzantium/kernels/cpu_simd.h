// SIMD helpers shared by the CPU kernels: AVX2 (cpu_attention.cpp, cpu_layer_ops.cpp, cpu_gemm.cpp) and, for the
// AVX-512 kernels (cpu_prefill_attention.cpp, cpu_decode512.cpp, the panel GEMMs), exp512 and silu_mul16
// under their own target.
#pragma once
#include <immintrin.h>

// exp for x <= 0 (scores minus their max): x = n ln2 + r with |r| <= ln2/2, exp(r) by its degree-6
// Taylor polynomial (relative error ~1e-7), 2^n put straight into the exponent bits.
static inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // below this 2^n leaves the normal range; exp is ~0 anyway
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);  // ln2 split in two for exactness
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// silu(g) = g * sigmoid(g), sigmoid from e = exp(-|g|) (never overflows): 1 / (1 + e) for g >= 0,
// e / (1 + e) below.
static inline __m256 silu8(__m256 g) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 e = exp_nonpositive(_mm256_or_ps(g, sign));  // exp(-|g|)
  const __m256 denominator = _mm256_add_ps(_mm256_set1_ps(1.0f), e);
  const __m256 negative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 numerator = _mm256_blendv_ps(_mm256_set1_ps(1.0f), e, negative);
  return _mm256_mul_ps(g, _mm256_div_ps(numerator, denominator));
}

static inline float hsum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_hadd_ps(h, h);
  h = _mm_hadd_ps(h, h);
  return _mm_cvtss_f32(h);
}


#pragma GCC push_options
#pragma GCC target("avx512f")

// exp_nonpositive at AVX-512 width, and exactly 0 below -87 (masked scores are -inf there).
static inline __m512 exp512(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(live, p, _mm512_castsi512_ps(bits));
}

// silu(g) * u, as silu8 above computes it: sigmoid from e = exp(-|g|).
static inline __m512 silu_mul16(__m512 g, __m512 u) {
  const __m512 e = exp512(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(g),
                                                              _mm512_set1_epi32((int)0x80000000))));
  const __m512 denominator = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
  const __m512 numerator = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ),
                                                _mm512_set1_ps(1.0f), e);
  return _mm512_mul_ps(_mm512_mul_ps(g, _mm512_div_ps(numerator, denominator)), u);
}

#pragma GCC pop_options
