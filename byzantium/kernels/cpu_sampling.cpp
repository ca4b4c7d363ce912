// Sampling one token of a row by an exponential race (the Gumbel-max trick), in one pass (AVX2 + FMA).
//
// token = argmax_i x_i + g_i, with x the row's logits over the temperature (-inf: excluded) and
// g_i = -log(-log u_i) Gumbel noise; u_i = (2 k_i + 1) / 2^24 with k_i the top 23 bits of a hash of
// (the row's stream, i), so u is exact in fp32, in (0, 1), and the same whichever rows share a batch.
// A token is drawn with probability softmax(x)_i, as by inverting the CDF; but where inverting the CDF
// lets rounding noise in any logit move every later boundary (a tail token flips with noise ~1e-6), the
// race changes its winner only when the two best scores are within the noise: the same seed gives the
// same tokens through kernels that round differently.
#include <torch/extension.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

// Natural log of positive normal floats: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by a degree-9
// polynomial in f = m - 1 (exact: no cancellation for x near 1), e ln2 added in two parts.
static inline __m256 log_positive(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256i bits = _mm256_castps_si256(x);
  __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(127)));
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007FFFFF)),
                                                 _mm256_set1_epi32(0x3F800000)));  // [1, 2)
  const __m256 big = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356f), _CMP_GE_OQ);
  m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), big);  // [sqrt(1/2), sqrt(2))
  e = _mm256_add_ps(e, _mm256_and_ps(big, one));
  const __m256 f = _mm256_sub_ps(m, one);
  const __m256 z = _mm256_mul_ps(f, f);
  __m256 p = _mm256_set1_ps(7.0376836292e-2f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.1514610310e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.1676998740e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.2420140846e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.4249322787e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.6668057665e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.0000714765e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-2.4999993993e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(3.3333331174e-1f));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, f), z);
  y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
  return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(f, y));
}

// murmur3's 32-bit finaliser: a bijection that spreads every input bit over the output.
static inline __m256i fmix32(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x85EBCA6Bu));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0xC2B2AE35u));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// x_i + g_i for the 8 tokens from index i; lanes past `valid` get -inf.
static inline __m256 scores8(const float* x, int64_t i, int valid, __m256i lo, __m256i hi) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i h = _mm256_mullo_epi32(_mm256_add_epi32(_mm256_set1_epi32((int32_t)i), lane),
                                 _mm256_set1_epi32((int)0x9E3779B1u));
  h = fmix32(_mm256_xor_si256(h, lo));
  h = fmix32(_mm256_xor_si256(h, hi));
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(h, 9), 1),
                                                                    _mm256_set1_epi32(1))),
                                 _mm256_set1_ps(1.0f / 16777216.0f));
  const __m256 exponential = _mm256_sub_ps(_mm256_setzero_ps(), log_positive(u));  // -log u > 0
  const __m256 gumbel = _mm256_sub_ps(_mm256_setzero_ps(), log_positive(exponential));
  __m256 values;
  if (valid == 8) {
    values = _mm256_loadu_ps(x + i);
  } else {
    alignas(32) float tail[8];
    for (int j = 0; j < 8; ++j) tail[j] = j < valid ? x[i + j] : -std::numeric_limits<float>::infinity();
    values = _mm256_load_ps(tail);
  }
  return _mm256_add_ps(values, gumbel);
}

// Gumbel noise never exceeds -log(-log((2^24 - 1) / 2^24)) = 16.64: a token whose logit is further than
// this below a score already reached cannot win, and its noise is not computed (most of an LM's vocabulary).
constexpr float NOISE_BOUND = 17.0f;

// The winning index of x [V] (fp32, contiguous) for the stream (lo, hi); -1 when no score is above -inf
// (every token excluded, or NaN logits).
int64_t race_sample(torch::Tensor x, int64_t stream_lo, int64_t stream_hi) {
  TORCH_CHECK(x.dim() == 1 && x.scalar_type() == at::kFloat && x.is_contiguous(), "race_sample: fp32 logits [V]");
  const int64_t V = x.numel();
  TORCH_CHECK(V < (int64_t(1) << 31), "race_sample: vocabulary too large");
  const float* xp = x.data_ptr<float>();
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const __m256i lo = _mm256_set1_epi32((int32_t)stream_lo), hi = _mm256_set1_epi32((int32_t)stream_hi);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // The threshold: the score of the largest logit's token (its own noise included), less the bound.
  __m256 running = _mm256_set1_ps(minus_inf);
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) running = _mm256_max_ps(running, _mm256_loadu_ps(xp + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, running);
  float largest = minus_inf;
  for (int j = 0; j < 8; ++j) largest = std::max(largest, lanes[j]);
  for (; i < V; ++i) largest = std::max(largest, xp[i]);
  int64_t top_index = 0;
  while (top_index < V - 1 && !(xp[top_index] >= largest)) ++top_index;
  alignas(32) float first[8];
  const int64_t block = top_index - top_index % 8;
  _mm256_store_ps(first, scores8(xp, block, (int)std::min<int64_t>(8, V - block), lo, hi));
  const __m256 threshold = _mm256_set1_ps(first[top_index - block] - NOISE_BOUND);
  __m256 best = _mm256_set1_ps(minus_inf);
  __m256i best_index = _mm256_set1_epi32(-1);
  for (int64_t i = 0; i < V; i += 8) {
    const int valid = (int)std::min<int64_t>(8, V - i);
    if (valid == 8 && _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(xp + i), threshold, _CMP_GT_OQ)) == 0)
      continue;
    const __m256 s = scores8(xp, i, valid, lo, hi);
    const __m256 better = _mm256_cmp_ps(s, best, _CMP_GT_OQ);  // strict: the lower index keeps a tie
    best = _mm256_blendv_ps(best, s, better);
    best_index = _mm256_castps_si256(_mm256_blendv_ps(
        _mm256_castsi256_ps(best_index), _mm256_castsi256_ps(_mm256_add_epi32(_mm256_set1_epi32((int32_t)i), lane)),
        better));
  }
  alignas(32) float scores[8];
  alignas(32) int32_t indices[8];
  _mm256_store_ps(scores, best);
  _mm256_store_si256((__m256i*)indices, best_index);
  int64_t winner = -1;
  float top = minus_inf;
  for (int j = 0; j < 8; ++j)
    if (indices[j] >= 0 && (scores[j] > top || (scores[j] == top && indices[j] < winner))) {
      top = scores[j];
      winner = indices[j];
    }
  return winner;
}

// torch.argmax(x, dim=-1) of fp32 rows x [N, V] (contiguous): the first index of each row's largest value,
// a NaN counting as the largest (as torch's); rows in parallel, one vectorised pass for the maximum and a
// scan for its first index: 165 vs 468 us (torch.argmax) at 32 x 49k rows, 368 vs 1032 us at 72.
torch::Tensor argmax_rows(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) > 0,
              "argmax_rows: fp32 rows [N, V]");
  const int64_t N = x.size(0), V = x.size(1);
  auto out = torch::empty({N}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * V;
      __m256 running = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      __m256 nan = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(row + i);
        running = _mm256_max_ps(running, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, running);
      float largest = lanes[0];
      for (int j = 1; j < 8; ++j) largest = std::max(largest, lanes[j]);
      bool has_nan = _mm256_movemask_ps(nan) != 0;
      for (; i < V; ++i) {
        has_nan |= std::isnan(row[i]);
        largest = std::max(largest, row[i]);
      }
      int64_t index = 0;
      if (has_nan) {
        while (!std::isnan(row[index])) ++index;
      } else {
        while (index < V - 1 && row[index] != largest) ++index;
      }
      op[r] = index;
    }
  });
  return out;
}
