// Causal prefill attention over the paged KV cache for x86 CPUs with AVX-512: the contract of
// reference.append_prefill_attention without a window (new tokens over their sequence's cached prefix and
// themselves), reading K/V in place from the block pool. Queries, arithmetic and output in fp32; the pool
// in fp32 or bf16 (bf16 keys and values widened a chunk at a time). A bf16 model on a CPU with
// avx512_bf16 passes bf16 queries: both products run on bf16 dot products, two head dims (scores) or two
// keys (values) per instruction, half the instructions of fp32. Scores: the queries against the keys read
// in place, exact products summed in fp32. Values: the softmax weights rounded to bf16 (as flash
// attention does for its second product), the values paired a chunk at a time, sums in fp32. The softmax
// itself and its normaliser stay fp32; the output is bf16.
//
// The torch path gathers each sequence's K/V out of the pool and runs SDPA, whose CPU kernel reached
// ~120 GFLOP/s on a 1024-token prompt (a third of that prefill's time). Here the query rows lie in the
// vector lanes: a tile is 48 rows (query positions x the query heads of one KV head, GQA), held
// transposed as [D][48], so a score is a broadcast key element times three row vectors, and a chunk's
// row maxima, exponentials and sums are plain vertical operations (no horizontal reductions). Per chunk
// of 64 keys: scores (8 keys x 48 rows in 24 registers), the online-softmax update, then the weighted
// values into the output tile, also held transposed (8 head dims x 48 rows in 24 registers). Only keys
// up to a tile's last position are read, and only the first seq_lens[b] slots of a sequence, so
// nothing else in the pool (NaN included) can leak; masked scores get weight exactly 0.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include "cpu_simd.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

bool avx512_bf16_supported();

namespace {

constexpr int ROWS = 48;   // query rows per tile: three 16-lane vectors
constexpr int CHUNK = 64;  // keys per online-softmax step
constexpr int KT = 8;      // keys per score micro-tile
constexpr int DT = 8;      // head dims per output micro-tile

struct Tile {  // query rows first_row .. first_row + rows - 1 of one sequence and KV head
  int64_t seq, kv_head, first_row, rows, keys;  // keys: how many of the sequence's first keys the tile reads
};

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx512f")

// scores[j][0:48] = key j . the tile's (scaled) query rows, for NK keys from `first_key` (position
// key_pos); a key past a row's position scores -inf for that row.
template <int NK>
static void score_tile(const float* qt, int64_t D, const float* const* key, int64_t key_pos, const int32_t* pos,
                       int32_t min_pos, float* scores) {
  __m512 acc[NK][3];
#pragma GCC unroll 8
  for (int j = 0; j < NK; ++j) acc[j][0] = acc[j][1] = acc[j][2] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const __m512 q0 = _mm512_load_ps(qt + d * ROWS), q1 = _mm512_load_ps(qt + d * ROWS + 16),
                 q2 = _mm512_load_ps(qt + d * ROWS + 32);
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j) {
      const __m512 k = _mm512_set1_ps(key[j][d]);
      acc[j][0] = _mm512_fmadd_ps(k, q0, acc[j][0]);
      acc[j][1] = _mm512_fmadd_ps(k, q1, acc[j][1]);
      acc[j][2] = _mm512_fmadd_ps(k, q2, acc[j][2]);
    }
  }
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  const bool masked = key_pos + NK - 1 > min_pos;  // some key is past some row's position
#pragma GCC unroll 8
  for (int j = 0; j < NK; ++j)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) {
      __m512 s = acc[j][v];
      if (masked) {
        const __m512i row_pos = _mm512_load_si512((const void*)(pos + 16 * v));
        s = _mm512_mask_mov_ps(minus_inf, _mm512_cmple_epi32_mask(_mm512_set1_epi32((int)(key_pos + j)), row_pos), s);
      }
      _mm512_store_ps(scores + j * ROWS + 16 * v, s);
    }
}

// out[d0:d0+8][0:48] = out * alpha + sum over the chunk's keys of value[j][d] * weights[j][0:48].
static void value_tile(float* out, const __m512* alpha, const float* weights, const float* const* value, int64_t nk,
                       int64_t d0) {
  __m512 acc[DT][3];
#pragma GCC unroll 8
  for (int dd = 0; dd < DT; ++dd)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) acc[dd][v] = _mm512_mul_ps(_mm512_load_ps(out + dd * ROWS + 16 * v), alpha[v]);
  for (int64_t j = 0; j < nk; ++j) {
    const __m512 w0 = _mm512_load_ps(weights + j * ROWS), w1 = _mm512_load_ps(weights + j * ROWS + 16),
                 w2 = _mm512_load_ps(weights + j * ROWS + 32);
    const float* vj = value[j] + d0;
#pragma GCC unroll 8
    for (int dd = 0; dd < DT; ++dd) {
      const __m512 x = _mm512_set1_ps(vj[dd]);
      acc[dd][0] = _mm512_fmadd_ps(x, w0, acc[dd][0]);
      acc[dd][1] = _mm512_fmadd_ps(x, w1, acc[dd][1]);
      acc[dd][2] = _mm512_fmadd_ps(x, w2, acc[dd][2]);
    }
  }
#pragma GCC unroll 8
  for (int dd = 0; dd < DT; ++dd)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) _mm512_store_ps(out + dd * ROWS + 16 * v, acc[dd][v]);
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

// score_tile for bf16 queries and keys (a bf16 model's, on a CPU with avx512_bf16): the tile's query rows
// held as (d, d + 1) pairs, [D / 2][48][2], and each key's pair broadcast, so one dot-product instruction
// does two head dims of 16 rows; the products are exact and summed in fp32, unscaled (the softmax scales).
template <int NK>
static void score_tile(const uint16_t* qp, int64_t D, const uint16_t* const* key, int64_t key_pos, const int32_t* pos,
                       int32_t min_pos, float* scores) {
  __m512 acc[NK][3];
#pragma GCC unroll 8
  for (int j = 0; j < NK; ++j) acc[j][0] = acc[j][1] = acc[j][2] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 2) {
    const uint16_t* qd = qp + d * ROWS;  // pair d / 2: 48 rows x 2 = three vectors
    const __m512bh q0 = (__m512bh)_mm512_load_si512(qd), q1 = (__m512bh)_mm512_load_si512(qd + 32),
                   q2 = (__m512bh)_mm512_load_si512(qd + 64);
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j) {
      int32_t pair;
      std::memcpy(&pair, key[j] + d, 4);
      const __m512bh k = (__m512bh)_mm512_set1_epi32(pair);
      acc[j][0] = _mm512_dpbf16_ps(acc[j][0], k, q0);
      acc[j][1] = _mm512_dpbf16_ps(acc[j][1], k, q1);
      acc[j][2] = _mm512_dpbf16_ps(acc[j][2], k, q2);
    }
  }
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  const bool masked = key_pos + NK - 1 > min_pos;
#pragma GCC unroll 8
  for (int j = 0; j < NK; ++j)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) {
      __m512 s = acc[j][v];
      if (masked) {
        const __m512i row_pos = _mm512_load_si512((const void*)(pos + 16 * v));
        s = _mm512_mask_mov_ps(minus_inf, _mm512_cmple_epi32_mask(_mm512_set1_epi32((int)(key_pos + j)), row_pos), s);
      }
      _mm512_store_ps(scores + j * ROWS + 16 * v, s);
    }
}

// The chunk's values as pairs of keys for value_tile's bf16 form: vp[d] = (a[d], b[d]) for the values a, b of
// keys 2jp and 2jp + 1 (b = nullptr: the odd chunk's last key, paired with zeros).
static void pair_values(const uint16_t* a, const uint16_t* b, uint32_t* vp, int64_t D) {
  alignas(64) static const uint16_t low[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                               8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t high[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(low), hi = _mm512_load_si512(high);
  for (int64_t d = 0; d < D; d += 32) {
    const int64_t n = std::min<int64_t>(32, D - d);
    const __mmask32 m = n == 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1);
    const __m512i x = _mm512_maskz_loadu_epi16(m, a + d), y = b ? _mm512_maskz_loadu_epi16(m, b + d) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(vp + d, n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1), _mm512_permutex2var_epi16(x, lo, y));
    if (n > 16)
      _mm512_mask_storeu_epi32(vp + d + 16, n >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - 16)) - 1),
                               _mm512_permutex2var_epi16(x, hi, y));
  }
}

// The chunk's softmax weights [nk][48] (fp32) rounded to bf16 as pairs of keys: wp[jp][0:48][2] (a zero
// weight past the last key).
static void pair_weights(const float* w, uint16_t* wp, int64_t nk) {
  alignas(64) static const uint16_t interleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(interleave);
  for (int64_t j = 0; j < nk; j += 2)
    for (int v = 0; v < 3; ++v) {
      const __m512 lo = _mm512_load_ps(w + j * ROWS + 16 * v);
      const __m512 hi = j + 1 < nk ? _mm512_load_ps(w + (j + 1) * ROWS + 16 * v) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // key j's 16 rows, then key j + 1's
      _mm512_store_si512(wp + j * ROWS + 32 * v, _mm512_permutexvar_epi16(idx, both));
    }
}

// value_tile's bf16 form: out[d0:d0+8][0:48] = out * alpha + the chunk's weighted values, a pair of keys per
// dot-product instruction (weights rounded to bf16, products exact, sums in fp32).
static void value_tile(float* out, const __m512* alpha, const uint16_t* wp, const uint32_t* vp, int64_t pairs,
                       int64_t D, int64_t d0) {
  __m512 acc[DT][3];
#pragma GCC unroll 8
  for (int dd = 0; dd < DT; ++dd)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) acc[dd][v] = _mm512_mul_ps(_mm512_load_ps(out + dd * ROWS + 16 * v), alpha[v]);
  for (int64_t jp = 0; jp < pairs; ++jp) {
    const uint16_t* w = wp + jp * 2 * ROWS;
    const __m512bh w0 = (__m512bh)_mm512_load_si512(w), w1 = (__m512bh)_mm512_load_si512(w + 32),
                   w2 = (__m512bh)_mm512_load_si512(w + 64);
    const uint32_t* vj = vp + jp * D + d0;
#pragma GCC unroll 8
    for (int dd = 0; dd < DT; ++dd) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32((int)vj[dd]);
      acc[dd][0] = _mm512_dpbf16_ps(acc[dd][0], x, w0);
      acc[dd][1] = _mm512_dpbf16_ps(acc[dd][1], x, w1);
      acc[dd][2] = _mm512_dpbf16_ps(acc[dd][2], x, w2);
    }
  }
#pragma GCC unroll 8
  for (int dd = 0; dd < DT; ++dd)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) _mm512_store_ps(out + dd * ROWS + 16 * v, acc[dd][v]);
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")

static inline float widen(float x) { return x; }
static inline float widen(uint16_t x) {
  const uint32_t bits = (uint32_t)x << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Scratch {  // one thread's buffers, 64-byte aligned
  std::vector<float> storage;
  float *qt, *out, *scores, *keys, *values, *weight_pairs;  // bf16 path: values holds value pairs
  Scratch(int64_t D) : storage(2 * D * ROWS + CHUNK * ROWS + 2 * CHUNK * D + CHUNK * ROWS / 2 + 16) {
    float* p = storage.data();
    p += (16 - ((uintptr_t)p / 4) % 16) % 16;
    qt = p;
    out = qt + D * ROWS;
    scores = out + D * ROWS;
    keys = scores + CHUNK * ROWS;
    values = keys + CHUNK * D;
    weight_pairs = values + CHUNK * D;
  }
};

// One tile, start to end. q rows [T, Hq, D] at stride q_ld; the pool [blocks, block_size, Hkv, D]; out
// [T, Hq, D] in the queries' type. Q = float: fp32 queries, scaled as they are laid out; the keys of a bf16
// pool widened a chunk at a time. Q = uint16_t: bf16 queries and pool (the tiles' bf16 forms), keys read in
// place, scores scaled in the softmax.
template <typename T, typename Q>
static void run_tile(const Tile& tile, Scratch& s, const Q* q, int64_t q_ld, const T* k_cache, const T* v_cache,
                     const int32_t* cu, const int32_t* lens, const int32_t* tables, int64_t width, int64_t block_size,
                     int64_t Hq, int64_t Hkv, int64_t D, float scale, Q* out) {
  constexpr bool bf16_scores = std::is_same<Q, uint16_t>::value;
  const int64_t group = Hq / Hkv, b = tile.seq, h = tile.kv_head;
  const int64_t q_len = cu[b + 1] - cu[b], first_query = lens[b] - q_len, stride = Hkv * D;
  alignas(64) int32_t pos[ROWS];
  int64_t token[ROWS], head[ROWS];  // each row's query token and head
  for (int i = 0; i < ROWS; ++i) {  // rows past the tile's end repeat its last row's position, with q = 0
    const int64_t row = tile.first_row + std::min<int64_t>(i, tile.rows - 1);
    token[i] = cu[b] + row / group, head[i] = h * group + row % group;
    pos[i] = (int32_t)(first_query + row / group);
  }
  const int32_t min_pos = pos[0];
  Q* qt = reinterpret_cast<Q*>(s.qt);
  for (int i = 0; i < ROWS; ++i) {
    const Q* qi = q + token[i] * q_ld + head[i] * D;
    if constexpr (bf16_scores) {  // (d, d + 1) pairs as one 32-bit lane, pair p of row i at [p][i] (D is even)
      uint32_t* pairs = reinterpret_cast<uint32_t*>(qt);
      for (int64_t p = 0; p < D / 2; ++p) {
        uint32_t pair = 0;
        if (i < tile.rows) std::memcpy(&pair, qi + 2 * p, 4);
        pairs[p * ROWS + i] = pair;
      }
    } else {
      for (int64_t d = 0; d < D; ++d) qt[d * ROWS + i] = i < tile.rows ? qi[d] * scale : 0.f;
    }
  }
  const __m512 softmax_scale = _mm512_set1_ps(bf16_scores ? scale : 1.f);
  std::fill(s.out, s.out + D * ROWS, 0.f);
  __m512 m[3], l[3];
  for (int v = 0; v < 3; ++v) m[v] = _mm512_set1_ps(-INFINITY), l[v] = _mm512_setzero_ps();
  const int32_t* table = tables + b * width;
  const Q* key[CHUNK];
  const float* value[CHUNK];
  const T* raw_value[CHUNK];  // bf16 path: the values in the pool
  uint32_t* value_pairs = reinterpret_cast<uint32_t*>(s.values);
  uint16_t* weight_pairs = reinterpret_cast<uint16_t*>(s.weight_pairs);
  for (int64_t k0 = 0; k0 < tile.keys; k0 += CHUNK) {
    const int64_t nk = std::min<int64_t>(CHUNK, tile.keys - k0);
    for (int64_t j = 0, blk = k0 / block_size, offset = k0 % block_size; j < nk; ++j) {
      const int64_t slot = (int64_t)table[blk] * block_size + offset;
      if (++offset == block_size) offset = 0, ++blk;
      const T* kp = k_cache + slot * stride + h * D;
      const T* vp = v_cache + slot * stride + h * D;
      if constexpr (std::is_same<T, float>::value) {
        key[j] = kp, value[j] = vp;
      } else if constexpr (bf16_scores) {
        key[j] = kp, raw_value[j] = vp;
      } else {
        float* kw = s.keys + j * D;
        float* vw = s.values + j * D;
        for (int64_t d = 0; d < D; ++d) kw[d] = widen(kp[d]), vw[d] = widen(vp[d]);
        key[j] = kw, value[j] = vw;
      }
    }
    int64_t j0 = 0;
    for (; j0 + KT <= nk; j0 += KT) score_tile<KT>(qt, D, key + j0, k0 + j0, pos, min_pos, s.scores + j0 * ROWS);
    switch (nk - j0) {
      case 1: score_tile<1>(qt, D, key + j0, k0 + j0, pos, min_pos, s.scores + j0 * ROWS); break;
      case 2: score_tile<2>(qt, D, key + j0, k0 + j0, pos, min_pos, s.scores + j0 * ROWS); break;
      case 3: score_tile<3>(qt, D, key + j0, k0 + j0, pos, min_pos, s.scores + j0 * ROWS); break;
      case 4: score_tile<4>(qt, D, key + j0, k0 + j0, pos, min_pos, s.scores + j0 * ROWS); break;
      case 5: score_tile<5>(qt, D, key + j0, k0 + j0, pos, min_pos, s.scores + j0 * ROWS); break;
      case 6: score_tile<6>(qt, D, key + j0, k0 + j0, pos, min_pos, s.scores + j0 * ROWS); break;
      case 7: score_tile<7>(qt, D, key + j0, k0 + j0, pos, min_pos, s.scores + j0 * ROWS); break;
      default: break;
    }
    // Online softmax: the new running max, the old terms' factor, this chunk's weights and their sum.
    __m512 alpha[3];
    for (int v = 0; v < 3; ++v) {
      __m512 top = m[v];
      for (int64_t j = 0; j < nk; ++j) top = _mm512_max_ps(top, _mm512_load_ps(s.scores + j * ROWS + 16 * v));
      alpha[v] = exp512(_mm512_mul_ps(_mm512_sub_ps(m[v], top), softmax_scale));
      __m512 sum = _mm512_setzero_ps();
      for (int64_t j = 0; j < nk; ++j) {
        const __m512 w = exp512(_mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(s.scores + j * ROWS + 16 * v), top),
                                              softmax_scale));
        _mm512_store_ps(s.scores + j * ROWS + 16 * v, w);
        sum = _mm512_add_ps(sum, w);
      }
      l[v] = _mm512_fmadd_ps(l[v], alpha[v], sum);
      m[v] = top;
    }
    if constexpr (bf16_scores) {
      for (int64_t j = 0; j < nk; j += 2)
        pair_values(raw_value[j], j + 1 < nk ? raw_value[j + 1] : nullptr, value_pairs + j / 2 * D, D);
      pair_weights(s.scores, weight_pairs, nk);
      for (int64_t d0 = 0; d0 < D; d0 += DT)
        value_tile(s.out + d0 * ROWS, alpha, weight_pairs, value_pairs, (nk + 1) / 2, D, d0);
    } else {
      for (int64_t d0 = 0; d0 < D; d0 += DT) value_tile(s.out + d0 * ROWS, alpha, s.scores, value, nk, d0);
    }
  }
  alignas(64) float inv[ROWS];
  for (int v = 0; v < 3; ++v) _mm512_store_ps(inv + 16 * v, _mm512_div_ps(_mm512_set1_ps(1.f), l[v]));
  for (int64_t i = 0; i < tile.rows; ++i) {
    Q* o = out + (token[i] * Hq + head[i]) * D;
    for (int64_t d = 0; d < D; ++d) {
      if constexpr (bf16_scores)
        o[d] = c10::BFloat16(s.out[d * ROWS + i] * inv[i]).x;  // rounded to nearest even, as torch's .to()
      else
        o[d] = s.out[d * ROWS + i] * inv[i];
    }
  }
}

template <typename T, typename Q>
static void run_tiles(const std::vector<std::vector<Tile>>& per_thread, const Q* q, int64_t q_ld, const T* k_cache,
                      const T* v_cache, const int32_t* cu, const int32_t* lens, const int32_t* tables, int64_t width,
                      int64_t block_size, int64_t Hq, int64_t Hkv, int64_t D, float scale, Q* out) {
  at::parallel_for(0, (int64_t)per_thread.size(), 1, [&](int64_t begin, int64_t end) {
    Scratch s(D);
    for (int64_t t = begin; t < end; ++t)
      for (const Tile& tile : per_thread[t])
        run_tile(tile, s, q, q_ld, k_cache, v_cache, cu, lens, tables, width, block_size, Hq, Hkv, D, scale, out);
  });
}

#pragma GCC pop_options

bool prefill_supported(int64_t head_dim) {
  return __builtin_cpu_supports("avx512f") && head_dim % DT == 0 && head_dim <= 512;
}

// The tiles of a step, dealt to the threads longest first, each to the least loaded (a tile's cost is the
// keys it reads): causal tiles differ in cost, and equal shares keep both cores busy to the end.
static std::vector<std::vector<Tile>> deal(const int32_t* cu, const int32_t* lens, int64_t B, int64_t Hkv,
                                           int64_t group, int threads) {
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = cu[b + 1] - cu[b], first_query = lens[b] - q_len, rows = q_len * group;
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t n = std::min<int64_t>(ROWS, rows - r0);
        tiles.push_back({b, h, r0, n, first_query + (r0 + n - 1) / group + 1});
      }
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& a, const Tile& b) { return a.keys > b.keys; });
  std::vector<std::vector<Tile>> per_thread(std::max(1, std::min<int>(threads, (int)tiles.size())));
  std::vector<int64_t> load(per_thread.size(), 0);
  for (const Tile& tile : tiles) {
    const size_t t = std::min_element(load.begin(), load.end()) - load.begin();
    per_thread[t].push_back(tile);
    load[t] += tile.keys + 16;  // + the tile's fixed work (its queries in, its output out)
  }
  return per_thread;
}

torch::Tensor paged_prefill_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                      torch::Tensor cu_seqlens_q, torch::Tensor seq_lens, torch::Tensor block_tables,
                                      double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "paged_prefill_attention: shapes");
  const bool bf16 = k_cache.scalar_type() == at::kBFloat16, bf16_q = q.scalar_type() == at::kBFloat16;
  TORCH_CHECK((q.scalar_type() == at::kFloat || (bf16_q && bf16)) && (k_cache.scalar_type() == at::kFloat || bf16) &&
              v_cache.scalar_type() == k_cache.scalar_type(),
              "paged_prefill_attention: fp32 queries and an fp32 or bf16 cache, or bf16 queries and cache");
  TORCH_CHECK(!bf16_q || avx512_bf16_supported(), "paged_prefill_attention: bf16 queries need avx512_bf16");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_prefill_attention: contiguous cache");
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2), block_size = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && Hq % Hkv == 0 && prefill_supported(D), "paged_prefill_attention: head layout");
  const int64_t B = seq_lens.numel();
  TORCH_CHECK(cu_seqlens_q.numel() == B + 1 && block_tables.dim() == 2 && block_tables.size(0) == B,
              "paged_prefill_attention: metadata");
  if (q.stride(2) != 1 || q.stride(1) != D) q = q.contiguous();  // rows may be strided (views of the QKV output)
  auto cu = cu_seqlens_q.to(at::kInt).contiguous();
  auto lens = seq_lens.to(at::kInt).contiguous();
  auto tables = block_tables.to(at::kInt).contiguous();
  const int32_t *cp = cu.data_ptr<int32_t>(), *lp = lens.data_ptr<int32_t>(), *tp = tables.data_ptr<int32_t>();
  const int64_t width = tables.size(1);
  TORCH_CHECK(cp[0] == 0 && cp[B] == T, "paged_prefill_attention: cu_seqlens_q must run from 0 to the query count");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = cp[b + 1] - cp[b];
    TORCH_CHECK(q_len >= 0 && lp[b] >= q_len && lp[b] <= width * block_size,
                "paged_prefill_attention: sequence ", b, " has ", q_len, " new tokens and length ", lp[b]);
    for (int64_t i = 0; i < (lp[b] + block_size - 1) / block_size; ++i)
      TORCH_CHECK(tp[b * width + i] >= 0 && tp[b * width + i] < k_cache.size(0), "paged_prefill_attention: block out of range");
  }
  auto out = torch::empty({T, Hq, D}, q.options());
  const auto per_thread = deal(cp, lp, B, Hkv, Hq / Hkv, at::get_num_threads());
  if (bf16_q)
    run_tiles(per_thread, (const uint16_t*)q.data_ptr(), q.stride(0), (const uint16_t*)k_cache.data_ptr(),
              (const uint16_t*)v_cache.data_ptr(), cp, lp, tp, width, block_size, Hq, Hkv, D, (float)scale,
              (uint16_t*)out.data_ptr());
  else if (bf16)
    run_tiles(per_thread, q.data_ptr<float>(), q.stride(0), (const uint16_t*)k_cache.data_ptr(),
              (const uint16_t*)v_cache.data_ptr(), cp, lp, tp, width, block_size, Hq, Hkv, D, (float)scale,
              out.data_ptr<float>());
  else
    run_tiles(per_thread, q.data_ptr<float>(), q.stride(0), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), cp, lp,
              tp, width, block_size, Hq, Hkv, D, (float)scale, out.data_ptr<float>());
  return out;
}
