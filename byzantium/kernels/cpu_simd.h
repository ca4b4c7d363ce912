// SIMD traits: what the kernels need of an instruction set, so that each kernel (cpu_gemm.h, cpu_decode.h,
// cpu_prefill.h, cpu_layer_ops.h) is written once and instantiated per instruction set: Avx2 (8 fp32 lanes,
// 16 registers), Avx512 (16 lanes, 32 registers) and Avx512Bf16 (Avx512 with the bf16 dot product and
// conversions). Elements are float, or uint16_t holding a bf16 (the upper half of an fp32: widened by a
// shift).
//
// Avx2 is compiled with the build's flags (-mavx2 -mfma). Avx512 and Avx512Bf16 are defined between target
// pragmas, and the kernels instantiated with them are compiled only in cpu_avx512.cpp and
// cpu_avx512_bf16.cpp, inside the same pragmas; every kernel helper is a template over its traits, so no
// function is compiled for two instruction sets under one name (tests/test_cpu_ext_build.py checks the
// built library). The library therefore loads on an AVX2-only CPU, where the callers, which check the CPU
// first, never reach the AVX-512 code. Include this header first, before any target pragma.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

// fp32 -> bf16 bits, rounded to nearest even (a NaN stays a NaN), as torch rounds.
inline uint16_t bf16_bits(float x) {
  if (std::isnan(x)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

inline float bf16_float(uint16_t x) {
  const uint32_t u = (uint32_t)x << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Avx2 {
  using Vec = __m256;
  using Mask = __m256;  // all ones in the lanes where true
  static constexpr int W = 8, REGS = 16;  // lanes, vector registers
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static Vec load(const uint16_t* p) {  // 8 bf16, widened
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
  }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Mask first(int64_t n) {  // lanes 0 .. n - 1
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)std::min<int64_t>(n, W)), lane));
  }
  // The first n lanes (n >= W: all of them); the others read as 0, and are not written.
  static Vec load_n(const float* p, int64_t n) {
    return n >= W ? load(p) : _mm256_maskload_ps(p, _mm256_castps_si256(first(n)));
  }
  static void store_n(float* p, Vec v, int64_t n) {
    if (n >= W)
      store(p, v);
    else
      _mm256_maskstore_ps(p, _mm256_castps_si256(first(n)), v);
  }
  static Vec select(Mask m, Vec a, Vec b) { return _mm256_blendv_ps(b, a, m); }  // m ? a : b
  static Mask less(Vec a, Vec b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static Mask at_least(Vec a, Vec b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }   // a * b + c
  static Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a * b
  static Vec neg_abs(Vec v) { return _mm256_or_ps(v, _mm256_set1_ps(-0.0f)); }   // -|v|
  static Vec round(Vec v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static Vec pow2(Vec n) {  // 2^n for whole n in the normal range, straight into the exponent bits
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static float reduce_add(Vec v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_hadd_ps(h, h);
    h = _mm_hadd_ps(h, h);
    return _mm_cvtss_f32(h);
  }
  static float reduce_max(Vec v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  }
  // The dot-product operands of an fp32 kernel (Avx512Bf16 adds bf16 pairs): lanes, one value in every
  // lane, acc + a * b.
  static Vec lanes(const float* p) { return load(p); }
  static Vec splat(const float* p) { return _mm256_broadcast_ss(p); }
  static Vec madd(Vec acc, Vec a, Vec b) { return fmadd(a, b, acc); }
  static Vec in_register(Vec v) {  // v in a register, where its uses share it (not loaded again by each)
    asm("" : "+v"(v));
    return v;
  }
  // v[t] (t < 8) -> one vector whose lane t is the sum of v[t]'s lanes: a transpose-and-add tree.
  static Vec fold(const Vec* v) {
    __m256 x[4], y[2];
    for (int i = 0; i < 4; ++i)  // lanes of pairs interleaved, halves added
      x[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; ++i) {
      const __m256d a = _mm256_castps_pd(x[2 * i]), b = _mm256_castps_pd(x[2 * i + 1]);
      y[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }  // y[i]: in each 128-bit half, the partial sums of keys 4i .. 4i + 3
    return _mm256_add_ps(_mm256_permute2f128_ps(y[0], y[1], 0x20), _mm256_permute2f128_ps(y[0], y[1], 0x31));
  }
};

#pragma GCC push_options
#pragma GCC target("avx512f")

struct Avx512 {
  using Vec = __m512;
  using Mask = __mmask16;
  static constexpr int W = 16, REGS = 32;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load(const uint16_t* p) {  // 16 bf16, widened
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
  }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Mask first(int64_t n) { return n >= W ? (Mask)0xFFFF : n <= 0 ? (Mask)0 : (Mask)((1u << n) - 1); }
  static Vec load_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void store_n(float* p, Vec v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), v); }
  static Vec select(Mask m, Vec a, Vec b) { return _mm512_mask_blend_ps(m, b, a); }  // m ? a : b
  static Mask less(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static Mask at_least(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static Mask at_most(int32_t a, const int32_t* b) {  // the lanes where a <= b[lane]
    return _mm512_cmple_epi32_mask(_mm512_set1_epi32(a), _mm512_loadu_si512((const void*)b));
  }
  static Mask not_below(int32_t a, const int32_t* b) {  // the lanes where a >= b[lane]
    return _mm512_cmpge_epi32_mask(_mm512_set1_epi32(a), _mm512_loadu_si512((const void*)b));
  }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }
  static Vec neg_abs(Vec v) {
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000)));
  }
  static Vec round(Vec v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static Vec pow2(Vec n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static float reduce_add(Vec v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(Vec v) { return _mm512_reduce_max_ps(v); }
  static Vec lanes(const float* p) { return load(p); }
  static Vec splat(const float* p) { return _mm512_set1_ps(*p); }
  static Vec madd(Vec acc, Vec a, Vec b) { return fmadd(a, b, acc); }
  static Vec in_register(Vec v) {
    asm("" : "+v"(v));
    return v;
  }
  static Vec fold(const Vec* v) {  // as Avx2::fold, over 16 keys
    __m512 x[8], y[4], z[2];
    for (int i = 0; i < 8; ++i)
      x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {
      const __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
      y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }  // y[i]: in each 128-bit lane, the partial sums of keys 4i .. 4i + 3
    for (int i = 0; i < 2; ++i)
      z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0x88), _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xDD));
  }
};

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

// Avx512 with bf16 elements: masked bf16 loads, stores rounded to nearest even, and VDPBF16PS, which
// multiplies 16 lanes of (k, k + 1) bf16 pairs and adds both products to fp32 sums.
struct Avx512Bf16 : Avx512 {
  using Avx512::load_n, Avx512::store, Avx512::store_n, Avx512::lanes, Avx512::splat, Avx512::madd;
  static Vec load_n(const uint16_t* p, int64_t n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(first(n), p)), 16));
  }
  static void store(uint16_t* p, Vec v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }
  static void store_n(uint16_t* p, Vec v, int64_t n) {
    _mm256_mask_storeu_epi16(p, first(n), (__m256i)_mm512_cvtneps_pbh(v));
  }
  static Vec round_bf16(Vec v) {  // v rounded to bf16, as fp32
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
  }
  static __m512bh lanes(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }  // 16 pairs
  static __m512bh splat(const uint16_t* p) {  // the pair p[0], p[1] in every lane
    int32_t pair;
    std::memcpy(&pair, p, 4);
    return (__m512bh)_mm512_set1_epi32(pair);
  }
  static Vec madd(Vec acc, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(acc, a, b); }
};

#pragma GCC pop_options
