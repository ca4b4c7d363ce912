// Causal prefill attention over the paged KV cache at AVX-512 width: the contract of
// reference.append_prefill_attention (new tokens over their sequence's cached prefix and themselves; with a
// sliding window or chunk, over the keys from first_visible_key on), reading K/V in place from the block
// pool. Instantiated (cpu_kernels.h's PrefillKernel) for fp32 queries over an fp32 or bf16 pool (bf16 keys
// and values widened a chunk at a time), and, on CPUs with avx512_bf16, for a bf16 model's bf16 queries: both products then run on bf16 dot products, two head dims
// (scores) or two keys (values) per instruction, half the instructions of fp32. Scores: the queries against
// the keys read in place, exact products summed in fp32. Values: the softmax weights rounded to bf16 (as
// flash attention does for its second product), the values paired a chunk at a time, sums in fp32. The
// softmax and its normaliser stay fp32; the output is bf16.
//
// The torch path gathers each sequence's K/V out of the pool and runs SDPA, whose CPU kernel reached ~120
// GFLOP/s on a 1024-token prompt (a third of that prefill's time). Here the query rows lie in the vector
// lanes: a tile is 48 rows (query positions x the query heads of one KV head, GQA), held transposed as
// [D][48], so a score is a broadcast key element times three row vectors, and a chunk's row maxima,
// exponentials and sums are plain vertical operations (no horizontal reductions). Per chunk of 64 keys:
// scores (8 keys x 48 rows in 24 registers), the online-softmax update, then the weighted values into the
// output tile, also held transposed (8 head dims x 48 rows in 24 registers). Only keys from a tile's first
// row's first visible key up to its last row's position are read, and only the first seq_lens[b] slots of a
// sequence, so nothing else in the pool (NaN included) can leak; masked scores get weight exactly 0. A row
// may see none of a chunk's keys (a window or chunk that starts past them): its running max stays -inf and
// exp_nonpositive takes the resulting NaN (-inf minus -inf) to 0, so the row adds nothing until its keys come.
#pragma once
#include "cpu_kernels.h"
#include "cpu_math.h"

constexpr int PREFILL_CHUNK = 64;  // keys per online-softmax step
constexpr int PREFILL_KT = 8;      // keys per score micro-tile
static_assert(PREFILL_ROWS == 48, "a tile's rows are three 16-lane vectors");

// scores[j][0:48] = key j . the tile's query rows, for NK keys from position key_pos; a key past a row's
// position (pos) or before its first visible key (lo) scores -inf for that row; max_lo is the largest lo.
// Q = float: fp32 queries held [D][48] (scaled as they were laid out). Q = uint16_t: bf16 queries held as
// (d, d + 1) pairs, [D / 2][48][2], each key's pair broadcast, so one dot-product instruction does two head
// dims of 16 rows (exact products summed in fp32, unscaled).
template <class V, int NK, class Q>
void score_tile(const Q* qt, int64_t D, const Q* const* key, int64_t key_pos, const int32_t* pos, int32_t min_pos,
                const int32_t* lo, int32_t max_lo, float* scores) {
  constexpr int STEP = sizeof(float) / sizeof(Q), ROWS = PREFILL_ROWS;  // STEP: head dims a lane
  typename V::Vec acc[NK][3];
#pragma GCC unroll 8
  for (int j = 0; j < NK; ++j) acc[j][0] = acc[j][1] = acc[j][2] = V::zero();
  for (int64_t d = 0; d < D; d += STEP) {
    const Q* qd = qt + d * ROWS;
    const auto q0 = V::lanes(qd), q1 = V::lanes(qd + 16 * STEP), q2 = V::lanes(qd + 32 * STEP);
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j) {
      const auto k = V::splat(key[j] + d);
      acc[j][0] = V::madd(acc[j][0], k, q0);
      acc[j][1] = V::madd(acc[j][1], k, q1);
      acc[j][2] = V::madd(acc[j][2], k, q2);
    }
  }
  const typename V::Vec minus_inf = V::set1(-INFINITY);
  const bool masked = key_pos + NK - 1 > min_pos || key_pos < max_lo;  // some key outside some row's keys
#pragma GCC unroll 8
  for (int j = 0; j < NK; ++j)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) {
      typename V::Vec s = acc[j][v];
      if (masked) {
        const int32_t k = (int32_t)(key_pos + j);
        s = V::select(V::at_most(k, pos + 16 * v) & V::not_below(k, lo + 16 * v), s, minus_inf);
      }
      V::store(scores + j * ROWS + 16 * v, s);
    }
}

// out[d0:d0+8][0:48] = out * alpha + the chunk's weighted values. Q = float: value[j] is key j's row,
// weights [nk][48]. Q = uint16_t: a pair of keys per dot-product instruction, weights rounded to bf16 as
// [nk / 2][48][2] and value[j / 2] the (key j, key j + 1) pairs of the head dims, [D][2].
template <class V, class Q>
void value_tile(float* out, const typename V::Vec* alpha, const Q* weights, const Q* const* value, int64_t nk,
                int64_t d0) {
  constexpr int STEP = sizeof(float) / sizeof(Q), ROWS = PREFILL_ROWS, DT = PREFILL_DT;  // STEP: keys a lane
  typename V::Vec acc[DT][3];
#pragma GCC unroll 8
  for (int dd = 0; dd < DT; ++dd)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) acc[dd][v] = V::mul(V::load(out + dd * ROWS + 16 * v), alpha[v]);
  for (int64_t j = 0; j < nk; j += STEP) {
    const Q* w = weights + j * ROWS;
    const auto w0 = V::lanes(w), w1 = V::lanes(w + 16 * STEP), w2 = V::lanes(w + 32 * STEP);
    const Q* vj = value[j / STEP] + d0 * STEP;
#pragma GCC unroll 8
    for (int dd = 0; dd < DT; ++dd) {
      const auto x = V::splat(vj + dd * STEP);
      acc[dd][0] = V::madd(acc[dd][0], x, w0);
      acc[dd][1] = V::madd(acc[dd][1], x, w1);
      acc[dd][2] = V::madd(acc[dd][2], x, w2);
    }
  }
#pragma GCC unroll 8
  for (int dd = 0; dd < DT; ++dd)
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) V::store(out + dd * ROWS + 16 * v, acc[dd][v]);
}

// The bf16 value_tile's operands. Values: vp[d] = (a[d], b[d]) for the values a, b of two keys (b = nullptr:
// the odd chunk's last key, paired with zeros).
template <class V>
void pair_values(const uint16_t* a, const uint16_t* b, uint32_t* vp, int64_t D) {
  alignas(64) static const uint16_t low[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                               8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t high[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(low), hi = _mm512_load_si512(high);
  for (int64_t d = 0; d < D; d += 32) {
    const int64_t n = std::min<int64_t>(32, D - d);
    const __mmask32 m = n == 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1);
    const __m512i x = _mm512_maskz_loadu_epi16(m, a + d), y = b ? _mm512_maskz_loadu_epi16(m, b + d) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(vp + d, V::first(n), _mm512_permutex2var_epi16(x, lo, y));
    if (n > 16) _mm512_mask_storeu_epi32(vp + d + 16, V::first(n - 16), _mm512_permutex2var_epi16(x, hi, y));
  }
}

// Weights: the chunk's softmax weights [nk][48] (fp32) rounded to bf16 as pairs of keys, wp[j / 2][0:48][2]
// (a zero weight past the last key).
template <class V>
void pair_weights(const float* w, uint16_t* wp, int64_t nk) {
  constexpr int ROWS = PREFILL_ROWS;
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

// One tile, start to end. Q = float: fp32 queries, scaled as they are laid out; the keys and values of a
// bf16 pool widened a chunk at a time. Q = uint16_t: bf16 queries and pool, keys read in place, scores
// scaled in the softmax, bf16 output.
template <class V, class Q, class T>
void PrefillKernel<V, Q, T>::run(const PrefillArgs<Q, T>& a, const PrefillTile& tile, std::vector<float>& scratch) {
  constexpr bool bf16_scores = std::is_same<Q, uint16_t>::value;
  constexpr int ROWS = PREFILL_ROWS, CHUNK = PREFILL_CHUNK, KT = PREFILL_KT, DT = PREFILL_DT;
  using Vec = typename V::Vec;
  const int64_t D = a.D, group = a.Hq / a.Hkv, b = tile.seq, h = tile.kv_head;
  const int64_t q_len = a.cu[b + 1] - a.cu[b], first_query = a.lens[b] - q_len, stride = a.Hkv * D;
  // The thread's buffers, 64-byte aligned: queries and output tiles, scores, widened keys and values (the
  // bf16 path: value pairs), weight pairs.
  scratch.resize(2 * D * ROWS + CHUNK * ROWS + 2 * CHUNK * D + CHUNK * ROWS / 2 + 16);
  float* const qt_storage = scratch.data() + (16 - ((uintptr_t)scratch.data() / 4) % 16) % 16;
  float *const out_tile = qt_storage + D * ROWS, *const scores = out_tile + D * ROWS;
  float *const keys = scores + CHUNK * ROWS, *const values = keys + CHUNK * D;
  uint16_t* const weight_pairs = reinterpret_cast<uint16_t*>(values + CHUNK * D);
  alignas(64) int32_t pos[ROWS], lo[ROWS];  // each row's position and first visible key
  int64_t token[ROWS], head[ROWS];  // each row's query token and head
  for (int i = 0; i < ROWS; ++i) {  // rows past the tile's end repeat its last row's position, with q = 0
    const int64_t row = tile.first_row + std::min<int64_t>(i, tile.rows - 1);
    token[i] = a.cu[b] + row / group, head[i] = h * group + row % group;
    pos[i] = (int32_t)(first_query + row / group);
    lo[i] = (int32_t)first_visible_key(pos[i], a.window, a.chunk);
  }
  const int32_t min_pos = pos[0], max_lo = lo[ROWS - 1];  // rows in position order
  Q* qt = reinterpret_cast<Q*>(qt_storage);
  for (int i = 0; i < ROWS; ++i) {
    const Q* qi = a.q + token[i] * a.q_ld + head[i] * D;
    if constexpr (bf16_scores) {  // (d, d + 1) pairs as one 32-bit lane, pair p of row i at [p][i] (D is even)
      uint32_t* pairs = reinterpret_cast<uint32_t*>(qt);
      for (int64_t p = 0; p < D / 2; ++p) {
        uint32_t pair = 0;
        if (i < tile.rows) std::memcpy(&pair, qi + 2 * p, 4);
        pairs[p * ROWS + i] = pair;
      }
    } else {
      for (int64_t d = 0; d < D; ++d) qt[d * ROWS + i] = i < tile.rows ? qi[d] * a.scale : 0.f;
    }
  }
  const Vec softmax_scale = V::set1(bf16_scores ? a.scale : 1.f);
  std::fill(out_tile, out_tile + D * ROWS, 0.f);
  Vec m[3], l[3];
  for (int v = 0; v < 3; ++v) m[v] = V::set1(-INFINITY), l[v] = V::zero();
  const int32_t* table = a.tables + b * a.width;
  const Q* key[CHUNK];
  const Q* value[CHUNK];    // fp32: each key's values; bf16: each pair of keys' value pairs
  const T* raw_value[CHUNK];  // bf16 path: the values in the pool
  for (int64_t k0 = tile.first_key; k0 < tile.keys; k0 += CHUNK) {
    const int64_t nk = std::min<int64_t>(CHUNK, tile.keys - k0);
    for (int64_t j = 0, blk = k0 / a.block_size, offset = k0 % a.block_size; j < nk; ++j) {
      const int64_t slot = (int64_t)table[blk] * a.block_size + offset;
      if (++offset == a.block_size) offset = 0, ++blk;
      const T* kp = a.k_cache + slot * stride + h * D;
      const T* vp = a.v_cache + slot * stride + h * D;
      if constexpr (std::is_same<T, float>::value) {
        key[j] = kp, value[j] = vp;
      } else if constexpr (bf16_scores) {
        key[j] = kp, raw_value[j] = vp;
      } else {
        float* kw = keys + j * D;
        float* vw = values + j * D;
        for (int64_t d = 0; d < D; ++d) kw[d] = bf16_float(kp[d]), vw[d] = bf16_float(vp[d]);
        key[j] = kw, value[j] = vw;
      }
    }
    int64_t j0 = 0;
    for (; j0 + KT <= nk; j0 += KT)
      score_tile<V, KT>(qt, D, key + j0, k0 + j0, pos, min_pos, lo, max_lo, scores + j0 * ROWS);
    switch (nk - j0) {
#define CASE(n) case n: score_tile<V, n>(qt, D, key + j0, k0 + j0, pos, min_pos, lo, max_lo, scores + j0 * ROWS); break;
      CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7)
#undef CASE
      default: break;
    }
    // Online softmax: the new running max, the old terms' factor, this chunk's weights and their sum.
    Vec alpha[3];
    for (int v = 0; v < 3; ++v) {
      Vec top = m[v];
      for (int64_t j = 0; j < nk; ++j) top = V::max(top, V::load(scores + j * ROWS + 16 * v));
      alpha[v] = exp_nonpositive<V>(V::mul(V::sub(m[v], top), softmax_scale));
      Vec sum = V::zero();
      for (int64_t j = 0; j < nk; ++j) {
        const Vec w = exp_nonpositive<V>(V::mul(V::sub(V::load(scores + j * ROWS + 16 * v), top), softmax_scale));
        V::store(scores + j * ROWS + 16 * v, w);
        sum = V::add(sum, w);
      }
      l[v] = V::fmadd(l[v], alpha[v], sum);
      m[v] = top;
    }
    if constexpr (bf16_scores) {
      uint16_t* pairs = reinterpret_cast<uint16_t*>(values);
      for (int64_t j = 0; j < nk; j += 2) {
        pair_values<V>(raw_value[j], j + 1 < nk ? raw_value[j + 1] : nullptr, reinterpret_cast<uint32_t*>(pairs + j * D),
                       D);
        value[j / 2] = pairs + j * D;
      }
      pair_weights<V>(scores, weight_pairs, nk);
      for (int64_t d0 = 0; d0 < D; d0 += DT) value_tile<V>(out_tile + d0 * ROWS, alpha, weight_pairs, value, nk, d0);
    } else {
      for (int64_t d0 = 0; d0 < D; d0 += DT) value_tile<V>(out_tile + d0 * ROWS, alpha, scores, value, nk, d0);
    }
  }
  alignas(64) float inv[ROWS];
  for (int v = 0; v < 3; ++v) V::store(inv + 16 * v, V::div(V::set1(1.f), l[v]));
  for (int64_t i = 0; i < tile.rows; ++i) {
    Q* o = a.out + (token[i] * a.Hq + head[i]) * D;
    for (int64_t d = 0; d < D; ++d) {
      if constexpr (bf16_scores)
        o[d] = bf16_bits(out_tile[d * ROWS + i] * inv[i]);  // rounded to nearest even, as torch's .to()
      else
        o[d] = out_tile[d * ROWS + i] * inv[i];
    }
  }
}
