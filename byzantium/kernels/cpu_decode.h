// Paged decode attention (the contract of reference.paged_decode_attention: one query token per sequence
// over the first seq_lens[b] slots of its block table, or with a sliding window or chunk only over the
// keys its query sees, from first_visible_key on), written once for W = 8 (AVX2) and 16 (AVX-512)
// lanes: queries, arithmetic and output in fp32, the pool in fp32 or bf16 (widened as it is loaded).
//
// The torch path gathers every sequence's K/V into a fresh tensor each layer and then runs SDPA; at batch 32
// the gather alone costs as much as the attention. Here K/V are read in place, in three passes (scores,
// softmax, weighted values). A key row is loaded once for the query heads that share it (GQA), its products
// with each left as W partial sums, and the partial sums of W keys folded into W scores together (V::fold, a
// transpose-and-add tree: ~3 instructions a score where a horizontal sum per key and head took ~8; at batch
// 64 x 200 tokens that sum was a fifth of a decode step). Values the same way: a value row loaded once, times
// each head's weight. The passes walk the block table a chunk of tokens at a time, every KV head and query
// head of the work item in turn over the chunk, so that each row comes from memory once; the blocks ahead
// are prefetched, since they lie wherever the block table says and the hardware prefetcher, which follows
// addresses, stalls at every block boundary. Only the slots of positions item.first .. seq_lens[b] - 1 are
// read, so whatever the rest of the pool holds (NaN included) cannot leak.
#pragma once
#include "cpu_kernels.h"
#include "cpu_math.h"

constexpr int64_t DECODE_AHEAD = 4;  // blocks prefetched ahead: a block computes faster than memory answers
// Tokens of a walk step: at most DECODE_CHUNK (fewer calls, loads of the queries and stores of the sums), and
// where the query heads of a KV head take several rounds, as many as keep its rows of the chunk (read again by
// each round) within 16 KB of L1 (AVX2 at head size 64 lost a quarter of its speed with 256 tokens).
constexpr int64_t DECODE_CHUNK = 256;

// Query heads of a KV head taken together (more: in rounds over the chunk, whose rows are then in cache).
// AVX2: as many as keep their value sums (heads x DV vectors) within 12 of its 16 registers: spilled, each of
// their FMAs also costs a store, and the value pass ran at half speed. AVX-512: up to 8, whatever the head
// size (as measured when its kernel was written).
template <class V, int DV>
constexpr int decode_round() { return V::W == 16 ? 8 : std::max(1, std::min(8, 12 / DV)); }

// The rows (row_bytes of each slot) of the block at position pos, if the sequence has it.
template <class V, class T>
inline void prefetch_block(const T* pool, const int32_t* table, int64_t blk, int64_t pos, int64_t length,
                           int64_t block_size, int64_t stride, int64_t row_bytes) {
  if (pos >= length) return;
  const T* rows = pool + (int64_t)table[blk] * block_size * stride;
  for (int64_t t = 0; t < std::min(block_size, length - pos); ++t)
    for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch((const char*)(rows + t * stride) + b, _MM_HINT_T1);
}

// A vector of a key or value row, for G query heads. Loaded once into a register for all of them where their
// vectors of the other operand fit in the registers too (GCC would rather fold the load into each head's FMA,
// tripling the loads); else, and for one head, left to the compiler.
template <class V, int DV, int G, class T>
inline typename V::Vec row_vector(const T* p) {
  if constexpr (G > 1 && (G + 1) * DV <= V::REGS * 3 / 4)
    return V::in_register(V::load(p));
  else
    return V::load(p);
}

// p, opaque to the compiler, so that the row's vectors are loaded from p + a constant: GCC would rather keep
// offset + W i for each vector i in a register of its own (more than there are, spilled and reloaded).
template <class V, class T>
inline const T* row_start(const T* p) {
  asm("" : "+r"(p));
  return p;
}

// scores[g][0:n] = q[g] . key t for n keys (rows[t] + offset) and G query heads (q scaled, [G][D]): a key
// row loaded once for the G heads, W keys' partial sums folded together.
template <class V, int DV, int G, class T>
void score_chunk(const float* q, const T* const* rows, int64_t offset, int64_t n, float* scores, int64_t ld) {
  using Vec = typename V::Vec;
  constexpr int W = V::W, D = W * DV;
  Vec qv[G][DV];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < DV; ++i) qv[g][i] = V::load(q + g * D + W * i);
  for (int64_t j0 = 0; j0 < n; j0 += W) {
    const int64_t m = std::min<int64_t>(W, n - j0);
    Vec partial[G][W];
    for (int64_t t = 0; t < W; ++t) {
      if (t >= m) {
        for (int g = 0; g < G; ++g) partial[g][t] = V::zero();
        continue;
      }
      const T* k = row_start<V>(rows[j0 + t] + offset);
      Vec kv[DV];
      for (int i = 0; i < DV; ++i) kv[i] = row_vector<V, DV, G>(k + W * i);
      for (int g = 0; g < G; ++g) {
        Vec a = V::mul(qv[g][0], kv[0]);
        for (int i = 1; i < DV; ++i) a = V::fmadd(qv[g][i], kv[i], a);
        partial[g][t] = a;
      }
    }
    for (int g = 0; g < G; ++g) V::store_n(scores + g * ld + j0, V::fold(partial[g]), m);
  }
}

// acc[g] += sum over n values (rows[t] + offset) of p[g][t] * value t, for G query heads (acc [G][D]).
template <class V, int DV, int G, class T>
void value_chunk(const float* p, int64_t ld, const T* const* rows, int64_t offset, int64_t n, float* acc) {
  using Vec = typename V::Vec;
  constexpr int W = V::W, D = W * DV;
  Vec a[G][DV];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < DV; ++i) a[g][i] = V::load(acc + g * D + W * i);
  for (int64_t t = 0; t < n; ++t) {
    const T* v = row_start<V>(rows[t] + offset);
    Vec vv[DV];
    for (int i = 0; i < DV; ++i) vv[i] = row_vector<V, DV, G>(v + W * i);
    for (int g = 0; g < G; ++g) {
      const Vec w = V::set1(p[g * ld + t]);
      for (int i = 0; i < DV; ++i) a[g][i] = V::fmadd(w, vv[i], a[g][i]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < DV; ++i) V::store(acc + g * D + W * i, a[g][i]);
}

// score_chunk or value_chunk (STAGE 0 or 1) for `heads` (1 .. G) query heads, the count a template argument.
template <class V, int DV, class T, int STAGE, int G = decode_round<V, DV>(), class... Args>
void heads_of(int64_t heads, Args... args) {
  if constexpr (G > 1)
    if (heads < G) return heads_of<V, DV, T, STAGE, G - 1>(heads, args...);
  if constexpr (STAGE == 0)
    score_chunk<V, DV, G, T>(args...);
  else
    value_chunk<V, DV, G, T>(args...);
}

// In place: scores [length] -> exp(scores - max) (lanes up to length + W may be written); returns 1 / sum.
template <class V>
float softmax_numerators(float* s, int64_t length) {
  using Vec = typename V::Vec;
  constexpr int W = V::W;
  const int64_t rest = length % W;
  const typename V::Mask tail = V::first(rest);  // the valid lanes of the last, partial vector
  const Vec minus_inf = V::set1(-INFINITY);
  Vec top = minus_inf;
  int64_t t = 0;
  for (; t + W <= length; t += W) top = V::max(top, V::load(s + t));
  if (rest) top = V::max(top, V::select(tail, V::load(s + t), minus_inf));
  const Vec m = V::set1(V::reduce_max(top));
  Vec sum = V::zero();
  for (t = 0; t + W <= length; t += W) {
    const Vec e = exp_nonpositive<V>(V::sub(V::load(s + t), m));
    V::store(s + t, e);
    sum = V::add(sum, e);
  }
  if (rest) {
    const Vec e = V::select(tail, exp_nonpositive<V>(V::sub(V::load(s + t), m)), V::zero());
    V::store(s + t, e);
    sum = V::add(sum, e);
  }
  return 1.f / V::reduce_add(sum);
}

// One work item: scores, softmax, weighted values. The passes walk the block table a chunk of tokens at a
// time from the first visible key, and at each block prefetch the one DECODE_AHEAD further on (all the
// item's rows of each slot). Scores are indexed from the first visible key.
template <class V, int DV, class T>
void decode_item(const DecodeItem<T>& a, std::vector<float>& scratch) {
  constexpr int W = V::W, D = W * DV, R = decode_round<V, DV>();
  const int64_t keys = a.length - a.first;
  const int64_t heads = a.kv_heads * a.group, ld = keys + W, row_bytes = a.kv_heads * D * (int64_t)sizeof(T);
  scratch.resize(heads * (2 * D + ld + 1));
  float *q = scratch.data(), *acc = q + heads * D, *inv = acc + heads * D, *scores = inv + heads;
  const float* q_in = a.q + a.first_kv * a.group * D;  // the item's query heads are consecutive
  for (int64_t i = 0; i < heads * D; ++i) q[i] = q_in[i] * a.scale;
  const int64_t chunk = a.group <= R ? DECODE_CHUNK
                                      : std::clamp<int64_t>(16384 / (D * sizeof(T)) / W * W, W, DECODE_CHUNK);
  const T* rows[DECODE_CHUNK];  // the chunk's slots: the item's first row of each
  auto chunks = [&](const T* pool, auto fn) {
    for (int64_t c0 = a.first, blk = a.first / a.block_size, offset = a.first % a.block_size; c0 < a.length;
         c0 += chunk) {
      const int64_t n = std::min(chunk, a.length - c0);
      for (int64_t t = 0; t < n; ++t) {
        if (offset == 0)
          prefetch_block<V>(pool, a.table, blk + DECODE_AHEAD, c0 + t + DECODE_AHEAD * a.block_size, a.length,
                            a.block_size, a.stride, row_bytes);
        rows[t] = pool + ((int64_t)a.table[blk] * a.block_size + offset) * a.stride;
        if (++offset == a.block_size) offset = 0, ++blk;
      }
      for (int64_t h = 0; h < a.kv_heads; ++h)
        for (int64_t g0 = 0; g0 < a.group; g0 += R)
          fn(c0 - a.first, n, h, g0, std::min<int64_t>(R, a.group - g0));  // scores from the first key
    }
  };
  chunks(a.k + a.first_kv * D, [&](int64_t i0, int64_t n, int64_t h, int64_t g0, int64_t g) {
    const int64_t j = h * a.group + g0;
    heads_of<V, DV, T, 0>(g, q + j * D, rows, h * D, n, scores + j * ld + i0, ld);
  });
  for (int64_t j = 0; j < heads; ++j) inv[j] = softmax_numerators<V>(scores + j * ld, keys);
  std::fill(acc, acc + heads * D, 0.f);
  chunks(a.v + a.first_kv * D, [&](int64_t i0, int64_t n, int64_t h, int64_t g0, int64_t g) {
    const int64_t j = h * a.group + g0;
    heads_of<V, DV, T, 1>(g, scores + j * ld + i0, ld, rows, h * D, n, acc + j * D);
  });
  float* out = a.out + a.first_kv * a.group * D;
  for (int64_t j = 0; j < heads; ++j)
    for (int i = 0; i < DV; ++i) V::store(out + j * D + W * i, V::mul(V::load(acc + j * D + W * i), V::set1(inv[j])));
}

template <class V, class T>
void DecodeKernel<V, T>::run(const DecodeItem<T>& item, std::vector<float>& scratch) {
  constexpr int W = V::W;  // every supported head size (decode_supported) is a multiple of 16
  switch (item.D) {
    case 16: return decode_item<V, 16 / W, T>(item, scratch);
    case 32: return decode_item<V, 32 / W, T>(item, scratch);
    case 64: return decode_item<V, 64 / W, T>(item, scratch);
    case 80: return decode_item<V, 80 / W, T>(item, scratch);
    case 96: return decode_item<V, 96 / W, T>(item, scratch);
    case 128: return decode_item<V, 128 / W, T>(item, scratch);
    default: return decode_item<V, 256 / W, T>(item, scratch);
  }
}
