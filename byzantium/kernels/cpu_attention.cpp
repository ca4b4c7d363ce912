// Paged decode attention for x86 CPUs with AVX2 + FMA: the contract of reference.paged_decode_attention,
// reading K/V in place from the block pool. Queries, arithmetic and output in fp32; the pool in fp32 or
// bf16 (each bf16 value widened as it is loaded: bf16 is the upper half of an fp32).
//
// The torch path gathers every sequence's K/V into a fresh tensor each layer and then runs SDPA; at
// batch 32 the gather alone costs as much as the attention. Here each sequence walks its block table once
// per pass, and the query heads that share a KV head (GQA) reuse its rows while they sit in cache. Three
// passes: scores, softmax (vectorised exp), weighted sum of V. Only the first seq_lens[b] slots are read,
// so whatever the rest of the pool holds (NaN included) cannot leak.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include "cpu_simd.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

// The four horizontal sums of a, b, c, d as one 128-bit vector.
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// One work item: a sequence's consecutive KV heads first_kv .. first_kv + kv_heads - 1 and the
// `heads` = kv_heads * group query heads that read them (query head j of the item reads KV head j / group).
template <typename T>  // the pool's element: float, or uint16_t holding bf16
struct Walk {
  const T* k;            // k_cache + first_kv * D; slot s, KV head h of the item at k + s * stride + h * D
  const T* v;
  const int32_t* table;  // the sequence's block table
  int64_t length, block_size, stride, group;
  int64_t width;         // elements of a slot the item reads: its KV heads x head_dim
};

// Asks for the item's rows of the next block while this one is computed: blocks lie wherever the block
// table says, so the hardware prefetcher, which follows addresses, stalls at every block boundary (the
// kernel streamed K/V at ~15 GB/s without this).
constexpr int64_t PREFETCH_BLOCKS = 4;  // how far ahead: a block's compute is shorter than the memory's latency

template <typename T>
static inline void prefetch_block(const Walk<T>& w, const T* pool, int64_t blk, int64_t pos) {
  if (pos >= w.length) return;
  const int64_t n = std::min(w.block_size, w.length - pos);
  const char* block = (const char*)(pool + (int64_t)w.table[blk] * w.block_size * w.stride);
  const int64_t stride_bytes = w.stride * sizeof(T), item_bytes = w.width * sizeof(T);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b = 0; b < item_bytes; b += 64) _mm_prefetch(block + t * stride_bytes + b, _MM_HINT_T1);
}

// scores[j][t] = q[j] . k_t for the item's query heads (q already scaled), t < length. Block by block,
// every head in turn, so each block is read from memory once and in order. DV = head_dim / 8.
template <int DV, typename T>
static void score_pass(const float* q, int64_t heads, const Walk<T>& w, float* scores) {
  for (int64_t pos = 0, blk = 0; pos < w.length; ++blk) {
    const int64_t n = std::min(w.block_size, w.length - pos);
    const T* block = w.k + (int64_t)w.table[blk] * w.block_size * w.stride;
    prefetch_block(w, w.k, blk + PREFETCH_BLOCKS, pos + n + (PREFETCH_BLOCKS - 1) * w.block_size);
    for (int64_t j = 0; j < heads; ++j) {
      const T* base = block + (j / w.group) * 8 * DV;
      __m256 qv[DV];
      for (int i = 0; i < DV; ++i) qv[i] = _mm256_loadu_ps(q + j * 8 * DV + 8 * i);
      float* row = scores + j * w.length + pos;
      int64_t t = 0;
      for (; t + 4 <= n; t += 4) {  // four tokens at once, even and odd halves apart: eight FMA chains
        const T* k0 = base + t * w.stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
        for (int i = 0; i < DV; i += 2) {  // every supported head size has an even DV
          a0 = _mm256_fmadd_ps(qv[i], load8(k0 + 8 * i), a0);
          a1 = _mm256_fmadd_ps(qv[i], load8(k0 + w.stride + 8 * i), a1);
          a2 = _mm256_fmadd_ps(qv[i], load8(k0 + 2 * w.stride + 8 * i), a2);
          a3 = _mm256_fmadd_ps(qv[i], load8(k0 + 3 * w.stride + 8 * i), a3);
          c0 = _mm256_fmadd_ps(qv[i + 1], load8(k0 + 8 * i + 8), c0);
          c1 = _mm256_fmadd_ps(qv[i + 1], load8(k0 + w.stride + 8 * i + 8), c1);
          c2 = _mm256_fmadd_ps(qv[i + 1], load8(k0 + 2 * w.stride + 8 * i + 8), c2);
          c3 = _mm256_fmadd_ps(qv[i + 1], load8(k0 + 3 * w.stride + 8 * i + 8), c3);
        }
        _mm_storeu_ps(row + t, hsum4(_mm256_add_ps(a0, c0), _mm256_add_ps(a1, c1), _mm256_add_ps(a2, c2),
                                     _mm256_add_ps(a3, c3)));
      }
      for (; t < n; ++t) {
        const T* kt = base + t * w.stride;
        __m256 a = _mm256_setzero_ps();
        for (int i = 0; i < DV; ++i) a = _mm256_fmadd_ps(qv[i], load8(kt + 8 * i), a);
        row[t] = hsum(a);
      }
    }
    pos += n;
  }
}

// In place: scores -> exp(scores - max); returns their sum.
static float softmax_numerators(float* s, int64_t length) {
  float top = -INFINITY;
  for (int64_t t = 0; t < length; ++t) top = std::max(top, s[t]);
  const __m256 topv = _mm256_set1_ps(top);
  __m256 total = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= length; t += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), topv));
    _mm256_storeu_ps(s + t, e);
    total = _mm256_add_ps(total, e);
  }
  float sum = hsum(total);
  for (; t < length; ++t) sum += (s[t] = std::exp(s[t] - top));
  return sum;
}

// out[j] = sum_t p[j][t] v_t / sums[j]; block by block like score_pass, each head's running sum in acc.
template <int DV, typename T>
static void value_pass(const float* p, const float* sums, int64_t heads, const Walk<T>& w, float* acc, float* out) {
  std::fill(acc, acc + heads * 8 * DV, 0.0f);
  for (int64_t pos = 0, blk = 0; pos < w.length; ++blk) {
    const int64_t n = std::min(w.block_size, w.length - pos);
    const T* block = w.v + (int64_t)w.table[blk] * w.block_size * w.stride;
    prefetch_block(w, w.v, blk + PREFETCH_BLOCKS, pos + n + (PREFETCH_BLOCKS - 1) * w.block_size);
    for (int64_t j = 0; j < heads; ++j) {
      const T* base = block + (j / w.group) * 8 * DV;
      __m256 a[DV];
      for (int i = 0; i < DV; ++i) a[i] = _mm256_loadu_ps(acc + j * 8 * DV + 8 * i);
      const float* weights = p + j * w.length + pos;
      for (int64_t t = 0; t < n; ++t) {
        const __m256 weight = _mm256_set1_ps(weights[t]);
        const T* vt = base + t * w.stride;
        for (int i = 0; i < DV; ++i) a[i] = _mm256_fmadd_ps(weight, load8(vt + 8 * i), a[i]);
      }
      for (int i = 0; i < DV; ++i) _mm256_storeu_ps(acc + j * 8 * DV + 8 * i, a[i]);
    }
    pos += n;
  }
  for (int64_t j = 0; j < heads; ++j) {
    const __m256 inv = _mm256_set1_ps(1.0f / sums[j]);
    for (int i = 0; i < DV; ++i)
      _mm256_storeu_ps(out + j * 8 * DV + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(acc + j * 8 * DV + 8 * i), inv));
  }
}

template <int DV, typename T>
static void decode(const float* q, int64_t q_ld, const T* kc, const T* vc, const int32_t* lens,
                   const int32_t* tables, float* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t block_size,
                   int64_t table_width, float scale) {
  constexpr int D = 8 * DV;
  const int64_t group = Hq / Hkv;
  // A whole sequence per item reads each of its blocks (all KV heads, contiguous) in one go;
  // with fewer sequences than about two per thread, one item per KV head instead, to keep threads busy.
  const int64_t kv_per_item = B >= 2 * at::get_num_threads() ? Hkv : 1, items_per_seq = Hkv / kv_per_item;
  const int64_t heads = kv_per_item * group;
  at::parallel_for(0, B * items_per_seq, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, scaled_q(heads * D), acc(heads * D), sums(heads);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / items_per_seq, first_kv = (item % items_per_seq) * kv_per_item;
      const Walk<T> w{kc + first_kv * D, vc + first_kv * D, tables + b * table_width, lens[b], block_size, Hkv * D, group,
                        kv_per_item * D};
      // The item's query heads are consecutive: first_kv * group .. + heads - 1.
      const int64_t first_head = b * Hq + first_kv * group;
      const float* q_heads = q + b * q_ld + first_kv * group * D;  // a query row's heads are contiguous
      for (int64_t d = 0; d < heads * D; ++d) scaled_q[d] = q_heads[d] * scale;
      scores.resize(heads * w.length);
      score_pass<DV, T>(scaled_q.data(), heads, w, scores.data());
      for (int64_t j = 0; j < heads; ++j) sums[j] = softmax_numerators(scores.data() + j * w.length, w.length);
      value_pass<DV, T>(scores.data(), sums.data(), heads, w, acc.data(), out + first_head * D);
    }
  });
}

bool decode_supported(int64_t head_dim) {
  for (int64_t d : {16, 32, 64, 80, 96, 128, 256})
    if (head_dim == d) return true;
  return false;
}

template <typename T>
static void dispatch(int64_t D, const float* qp, int64_t q_ld, const T* kp, const T* vp, const int32_t* lp, const int32_t* tp,
                     float* op, int64_t B, int64_t Hq, int64_t Hkv, int64_t block_size, int64_t width, float scale) {
  switch (D) {
    case 16: decode<2, T>(qp, q_ld, kp, vp, lp, tp, op, B, Hq, Hkv, block_size, width, scale); break;
    case 32: decode<4, T>(qp, q_ld, kp, vp, lp, tp, op, B, Hq, Hkv, block_size, width, scale); break;
    case 64: decode<8, T>(qp, q_ld, kp, vp, lp, tp, op, B, Hq, Hkv, block_size, width, scale); break;
    case 80: decode<10, T>(qp, q_ld, kp, vp, lp, tp, op, B, Hq, Hkv, block_size, width, scale); break;
    case 96: decode<12, T>(qp, q_ld, kp, vp, lp, tp, op, B, Hq, Hkv, block_size, width, scale); break;
    case 128: decode<16, T>(qp, q_ld, kp, vp, lp, tp, op, B, Hq, Hkv, block_size, width, scale); break;
    default: decode<32, T>(qp, q_ld, kp, vp, lp, tp, op, B, Hq, Hkv, block_size, width, scale); break;
  }
}

torch::Tensor paged_decode_attention512(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                        torch::Tensor seq_lens, torch::Tensor block_tables, double scale);

// avx512: take cpu_decode512.cpp's kernel where the CPU and the head size allow (false: this file's, at AVX2
// width, as on CPUs without AVX-512).
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor seq_lens, torch::Tensor block_tables, double scale, bool avx512) {
  if (avx512 && __builtin_cpu_supports("avx512f") && q.dim() == 3 && q.size(2) % 16 == 0)
    return paged_decode_attention512(q, k_cache, v_cache, seq_lens, block_tables, scale);
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "paged_decode_attention: shapes");
  const bool bf16 = k_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK(q.scalar_type() == at::kFloat && (k_cache.scalar_type() == at::kFloat || bf16) &&
              v_cache.scalar_type() == k_cache.scalar_type(),
              "paged_decode_attention: fp32 queries, an fp32 or bf16 cache");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_decode_attention: contiguous cache");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t block_size = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && Hq % Hkv == 0 && decode_supported(D), "paged_decode_attention: head layout");
  TORCH_CHECK(seq_lens.numel() == B && block_tables.dim() == 2 && block_tables.size(0) == B, "paged_decode_attention: metadata");
  if (q.stride(2) != 1 || q.stride(1) != D) q = q.contiguous();  // rows may be strided (views of the QKV output)
  auto lens = seq_lens.to(at::kInt).contiguous();
  auto tables = block_tables.to(at::kInt).contiguous();
  const int32_t* lp = lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= tables.size(1) * block_size, "paged_decode_attention: seq_lens out of range");
  auto out = torch::empty({B, Hq, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const int32_t* tp = tables.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const int64_t width = tables.size(1);
  if (bf16)
    dispatch(D, qp, q.stride(0), (const uint16_t*)k_cache.data_ptr(), (const uint16_t*)v_cache.data_ptr(), lp, tp, op, B, Hq, Hkv,
             block_size, width, (float)scale);
  else
    dispatch(D, qp, q.stride(0), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), lp, tp, op, B, Hq, Hkv, block_size, width,
             (float)scale);
  return out;
}

// Writes k, v [T, Hkv, D] (each token's heads contiguous, any token stride: views of the QKV projection)
// into their cache slots slot_mapping[T] (int64; -1: not stored) of k_cache, v_cache [blocks, block_size,
// Hkv, D] (contiguous, the dtype of k and v): one copy per token and tensor, where index_copy_ on the
// strided views cost two calls and a gather each.
void store_kv(torch::Tensor k, torch::Tensor v, torch::Tensor k_cache, torch::Tensor v_cache,
              torch::Tensor slot_mapping) {
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes(), "store_kv: k, v [T, Hkv, D]");
  TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == v_cache.scalar_type() &&
              k.scalar_type() == v.scalar_type(), "store_kv: k, v and the caches share one dtype");
  const int64_t T = k.size(0), row = k.size(1) * k.size(2);
  for (const auto* t : {&k, &v})
    TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == t->size(2), "store_kv: each token's heads contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.numel() == v_cache.numel() &&
              k_cache.size(-1) * k_cache.size(-2) == row, "store_kv: contiguous caches [blocks, block_size, Hkv, D]");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.numel() == T,
              "store_kv: slot_mapping int64 [T]");
  const int64_t slots = k_cache.numel() / row, size = k.element_size();
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(slot[t] >= -1 && slot[t] < slots, "store_kv: slot ", slot[t], " outside the cache");
  const char *kp = (const char*)k.data_ptr(), *vp = (const char*)v.data_ptr();
  char *kc = (char*)k_cache.data_ptr(), *vc = (char*)v_cache.data_ptr();
  const int64_t k_ld = k.stride(0) * size, v_ld = v.stride(0) * size, bytes = row * size;
  at::parallel_for(0, T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slot[t] < 0) continue;
      std::memcpy(kc + slot[t] * bytes, kp + t * k_ld, bytes);
      std::memcpy(vc + slot[t] * bytes, vp + t * v_ld, bytes);
    }
  });
}
