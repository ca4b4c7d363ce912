// Paged decode attention for CPUs with AVX-512: the contract of cpu_attention.cpp's kernel (one query token
// per sequence over its first seq_lens[b] slots; fp32 queries and arithmetic, an fp32 or bf16 pool), with
// fewer instructions per cached token. cpu_attention.cpp, at AVX2 width, takes each query head in turn
// over a block and sums every dot product across its vector; at batch 64 x 200 tokens that was a fifth
// of a decode step. Here a KV head's key row is loaded once for all the query heads that share it (GQA),
// its products with each of them left as 16 partial sums, and the partial sums of 16 keys folded into the
// 16 scores together (a transpose-and-add tree: ~3 instructions a score instead of ~8). Values the same
// way: a value row loaded once, times each head's weight. Three passes as there (scores, softmax,
// weighted values), the next blocks prefetched, since they lie wherever the block table says.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include "cpu_simd.h"
#include <algorithm>
#include <cmath>
#include <vector>

namespace {
constexpr int MAX_GROUP = 8;            // query heads per KV head handled at once (more: in rounds)
constexpr int64_t PREFETCH_AHEAD = 4;   // blocks ahead: one block computes faster than memory answers
}

#pragma GCC push_options
#pragma GCC target("avx512f")

static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

// v[t] (t < 16) -> one vector whose lane t is the sum of v[t]'s lanes.
static inline __m512 fold16(__m512* v) {
  __m512 x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i)  // lanes of pairs interleaved, halves added
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
    y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }  // y[i]: in each 128-bit lane, partial sums of keys 4i .. 4i + 3
  for (int i = 0; i < 2; ++i)
    z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0x88), _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xDD));
}

// At the start of block `blk` (position `pos`): the rows of the block PREFETCH_AHEAD further on.
template <typename T>
static inline void ahead(const T* pool, const int32_t* table, int64_t blk, int64_t pos, int64_t length,
                         int64_t block_size, int64_t stride, int64_t row_bytes) {
  const int64_t first = pos + PREFETCH_AHEAD * block_size;
  if (first >= length) return;
  const T* rows = pool + (int64_t)table[blk + PREFETCH_AHEAD] * block_size * stride;
  for (int64_t t = 0; t < std::min(block_size, length - first); ++t)
    for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch((const char*)(rows + t * stride) + b, _MM_HINT_T1);
}

// One sequence and KV head: G query heads (q scaled, [G][D]) over `length` keys. scores: [G][length + 16].
// fetch_k, fetch_v, fetch_bytes: what to prefetch of each slot ahead (the item's own rows, or all KV heads
// of the slot when the sequence's other heads come next on this thread; 0 bytes: nothing).
template <int DV, int G, typename T>
static void attend(const float* q, const T* k_pool, const T* v_pool, const int32_t* table, int64_t length,
                   int64_t block_size, int64_t stride, float* scores, int64_t ld, float* out, const T* fetch_k,
                   const T* fetch_v, int64_t fetch_bytes) {
  constexpr int D = 16 * DV;
  __m512 qv[G][DV];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < DV; ++i) qv[g][i] = _mm512_loadu_ps(q + g * D + 16 * i);
  // Scores, 16 keys at a time, walking the block table (a block may end inside a group of 16).
  __m512 partial[G][16];
  int64_t blk = 0, offset = 0;
  for (int64_t t0 = 0; t0 < length; t0 += 16) {
    const int64_t n = std::min<int64_t>(16, length - t0);
    for (int64_t t = 0; t < 16; ++t) {
      if (t >= n) {
        for (int g = 0; g < G; ++g) partial[g][t] = _mm512_setzero_ps();
        continue;
      }
      if (offset == 0) ahead(fetch_k, table, blk, t0 + t, length, block_size, stride, fetch_bytes);
      const T* k = k_pool + ((int64_t)table[blk] * block_size + offset) * stride;
      if (++offset == block_size) offset = 0, ++blk;
      __m512 kv[DV];
      for (int i = 0; i < DV; ++i) kv[i] = load16(k + 16 * i);
      for (int g = 0; g < G; ++g) {
        __m512 a = _mm512_mul_ps(qv[g][0], kv[0]);
        for (int i = 1; i < DV; ++i) a = _mm512_fmadd_ps(qv[g][i], kv[i], a);
        partial[g][t] = a;
      }
    }
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(scores + g * ld + t0, fold16(partial[g]));
  }
  // Softmax numerators (the scores past `length` in the last group of 16 are masked off) and their sums.
  const __mmask16 tail = (__mmask16)((1u << (length % 16)) - 1);
  float inv[G];
  for (int g = 0; g < G; ++g) {
    float* s = scores + g * ld;
    __m512 top = _mm512_set1_ps(-INFINITY);
    int64_t t = 0;
    for (; t + 16 <= length; t += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(s + t));
    if (tail) top = _mm512_mask_max_ps(top, tail, top, _mm512_loadu_ps(s + t));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    for (t = 0; t + 16 <= length; t += 16) {
      const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), m));
      _mm512_storeu_ps(s + t, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (tail) {
      const __m512 e = _mm512_maskz_mov_ps(tail, exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), m)));
      _mm512_storeu_ps(s + t, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv[g] = 1.f / _mm512_reduce_add_ps(sum);
  }
  // Weighted values: each row loaded once for the G heads.
  __m512 acc[G][DV];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < DV; ++i) acc[g][i] = _mm512_setzero_ps();
  blk = 0, offset = 0;
  for (int64_t t = 0; t < length; ++t) {
    if (offset == 0) ahead(fetch_v, table, blk, t, length, block_size, stride, fetch_bytes);
    const T* v = v_pool + ((int64_t)table[blk] * block_size + offset) * stride;
    if (++offset == block_size) offset = 0, ++blk;
    __m512 vv[DV];
    for (int i = 0; i < DV; ++i) vv[i] = load16(v + 16 * i);
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(scores[g * ld + t]);
      for (int i = 0; i < DV; ++i) acc[g][i] = _mm512_fmadd_ps(w, vv[i], acc[g][i]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < DV; ++i) _mm512_storeu_ps(out + g * D + 16 * i, _mm512_mul_ps(acc[g][i], _mm512_set1_ps(inv[g])));
}

template <int DV, int G, typename T>
static void attend_rounds(int64_t group, const float* q, const T* k, const T* v, const int32_t* table, int64_t length,
                          int64_t block_size, int64_t stride, float* scores, int64_t ld, float* out, const T* fetch_k,
                          const T* fetch_v, int64_t fetch_bytes) {
  constexpr int D = 16 * DV;
  for (int64_t g0 = 0; g0 < group; g0 += G, fetch_bytes = 0) {  // later rounds find the rows in cache
    switch (std::min<int64_t>(G, group - g0)) {
#define CASE(n) case n: attend<DV, n, T>(q + g0 * D, k, v, table, length, block_size, stride, scores, ld, out + g0 * D, \
                                         fetch_k, fetch_v, fetch_bytes); break;
      CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) default: CASE(8)
#undef CASE
    }
  }
}

// Items: whole sequences, their KV heads in turn (the first walk prefetching every head's rows, which the
// next walks then find in cache: whole slots stream from memory in order), or, with fewer sequences than
// two per thread, one KV head of a sequence each, to keep the threads busy.
template <int DV, typename T>
static void decode512(const float* q, int64_t q_ld, const T* kc, const T* vc, const int32_t* lens, const int32_t* tables,
                      float* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t block_size, int64_t width, float scale) {
  constexpr int D = 16 * DV;
  const int64_t group = Hq / Hkv;
  const int64_t kv_per_item = B >= 2 * at::get_num_threads() ? Hkv : 1, items_per_seq = Hkv / kv_per_item;
  at::parallel_for(0, B * items_per_seq, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scaled(group * D), scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / items_per_seq, first_kv = (item % items_per_seq) * kv_per_item, length = lens[b];
      const int64_t ld = length + 16;
      scores.resize(std::min<int64_t>(group, MAX_GROUP) * ld);
      for (int64_t h = first_kv; h < first_kv + kv_per_item; ++h) {
        const float* qh = q + b * q_ld + h * group * D;  // the KV head's query heads are consecutive
        for (int64_t i = 0; i < group * D; ++i) scaled[i] = qh[i] * scale;
        const bool first = h == first_kv;
        attend_rounds<DV, MAX_GROUP, T>(group, scaled.data(), kc + h * D, vc + h * D, tables + b * width, length,
                                        block_size, Hkv * D, scores.data(), ld, out + (b * Hq + h * group) * D,
                                        kc + first_kv * D, vc + first_kv * D,
                                        first ? kv_per_item * D * (int64_t)sizeof(T) : 0);
      }
    }
  });
}

template <typename T>
static void dispatch512(int64_t D, const float* q, int64_t q_ld, const T* k, const T* v, const int32_t* lens,
                        const int32_t* tables, float* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t bs, int64_t width,
                        float scale) {
  switch (D) {
    case 16: decode512<1, T>(q, q_ld, k, v, lens, tables, out, B, Hq, Hkv, bs, width, scale); break;
    case 32: decode512<2, T>(q, q_ld, k, v, lens, tables, out, B, Hq, Hkv, bs, width, scale); break;
    case 64: decode512<4, T>(q, q_ld, k, v, lens, tables, out, B, Hq, Hkv, bs, width, scale); break;
    case 80: decode512<5, T>(q, q_ld, k, v, lens, tables, out, B, Hq, Hkv, bs, width, scale); break;
    case 96: decode512<6, T>(q, q_ld, k, v, lens, tables, out, B, Hq, Hkv, bs, width, scale); break;
    case 128: decode512<8, T>(q, q_ld, k, v, lens, tables, out, B, Hq, Hkv, bs, width, scale); break;
    default: decode512<16, T>(q, q_ld, k, v, lens, tables, out, B, Hq, Hkv, bs, width, scale); break;
  }
}

#pragma GCC pop_options

bool decode_supported(int64_t head_dim);

torch::Tensor paged_decode_attention512(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                        torch::Tensor seq_lens, torch::Tensor block_tables, double scale) {
  TORCH_CHECK(__builtin_cpu_supports("avx512f"), "paged_decode_attention512: this CPU has no AVX-512");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "paged_decode_attention512: shapes");
  const bool bf16 = k_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK(q.scalar_type() == at::kFloat && (k_cache.scalar_type() == at::kFloat || bf16) &&
              v_cache.scalar_type() == k_cache.scalar_type(),
              "paged_decode_attention512: fp32 queries, an fp32 or bf16 cache");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_decode_attention512: contiguous cache");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), block_size = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && Hq % Hkv == 0 && decode_supported(D) && D % 16 == 0,
              "paged_decode_attention512: head layout");
  TORCH_CHECK(seq_lens.numel() == B && block_tables.dim() == 2 && block_tables.size(0) == B,
              "paged_decode_attention512: metadata");
  if (q.stride(2) != 1 || q.stride(1) != D) q = q.contiguous();
  auto lens = seq_lens.to(at::kInt).contiguous();
  auto tables = block_tables.to(at::kInt).contiguous();
  const int32_t *lp = lens.data_ptr<int32_t>(), *tp = tables.data_ptr<int32_t>();
  const int64_t width = tables.size(1);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= width * block_size, "paged_decode_attention512: seq_lens out of range");
  auto out = torch::empty({B, Hq, D}, q.options());
  if (bf16)
    dispatch512(D, q.data_ptr<float>(), q.stride(0), (const uint16_t*)k_cache.data_ptr(), (const uint16_t*)v_cache.data_ptr(),
                lp, tp, out.data_ptr<float>(), B, Hq, Hkv, block_size, width, (float)scale);
  else
    dispatch512(D, q.data_ptr<float>(), q.stride(0), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), lp, tp,
                out.data_ptr<float>(), B, Hq, Hkv, block_size, width, (float)scale);
  return out;
}
