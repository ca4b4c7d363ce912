// Attention over the paged KV cache, the torch side: argument checks, the choice of instruction set and the
// work shared between threads. The kernels: cpu_decode.h (decode: one query token per sequence; AVX2 and
// AVX-512) and cpu_prefill.h (causal prefill tiles; AVX-512, bf16 queries on avx512_bf16), both with the
// sliding-window and chunk masks (window > 0, chunk > 0: a query reads its keys from first_visible_key on).
// Also store_kv, which writes new tokens' K/V into their slots.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include "cpu_kernels.h"

bool avx512_supported();
bool avx512_bf16_supported();

bool decode_supported(int64_t head_dim) {
  for (int64_t d : {16, 32, 64, 80, 96, 128, 256})
    if (head_dim == d) return true;
  return false;
}

// Work items: whole sequences, their KV heads in turn (a block of every KV head is contiguous, read in one
// go), or, with fewer sequences than two per thread, one KV head of a sequence each, to keep the threads busy.
template <class V, class T>
static void decode(const float* q, int64_t q_ld, const T* k, const T* v, const int32_t* lens, const int32_t* tables,
                   int64_t width, float* out, int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t block_size,
                   int64_t window, int64_t chunk, float scale) {
  const int64_t kv_per_item = B >= 2 * at::get_num_threads() ? Hkv : 1, items_per_seq = Hkv / kv_per_item;
  at::parallel_for(0, B * items_per_seq, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / items_per_seq, first_kv = (item % items_per_seq) * kv_per_item;
      const int64_t first = first_visible_key(lens[b] - 1, window, chunk);  // the query is the last token
      DecodeKernel<V, T>::run({q + b * q_ld, k, v, tables + b * width, first, lens[b], block_size, Hkv * D,
                               first_kv, kv_per_item, Hq / Hkv, D, scale, out + b * Hq * D}, scratch);
    }
  });
}

// Decode attention, the contract of reference.paged_decode_attention: fp32 queries q [B, Hq, D] (rows may be
// strided: views of the QKV output), an fp32 or bf16 pool [blocks, block_size, Hkv, D]. avx512: the AVX-512
// kernel where the CPU has it (false: the AVX2 one, as on CPUs without AVX-512). window, chunk: the
// reference's masks (0: none).
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor seq_lens, torch::Tensor block_tables, double scale, bool avx512,
                                     int64_t window, int64_t chunk) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "paged_decode_attention: shapes");
  const bool bf16 = k_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK(q.scalar_type() == at::kFloat && (k_cache.scalar_type() == at::kFloat || bf16) &&
              v_cache.scalar_type() == k_cache.scalar_type(),
              "paged_decode_attention: fp32 queries, an fp32 or bf16 cache");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_decode_attention: contiguous cache");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), block_size = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && Hq % Hkv == 0 && decode_supported(D), "paged_decode_attention: head layout");
  TORCH_CHECK(seq_lens.numel() == B && block_tables.dim() == 2 && block_tables.size(0) == B,
              "paged_decode_attention: metadata");
  TORCH_CHECK(window >= 0 && chunk >= 0, "paged_decode_attention: window and chunk are sizes (0: none)");
  if (q.stride(2) != 1 || q.stride(1) != D) q = q.contiguous();
  auto lens = seq_lens.to(at::kInt).contiguous();
  auto tables = block_tables.to(at::kInt).contiguous();
  const int32_t *lp = lens.data_ptr<int32_t>(), *tp = tables.data_ptr<int32_t>();
  const int64_t width = tables.size(1);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= width * block_size, "paged_decode_attention: seq_lens out of range");
  auto out = torch::empty({B, Hq, D}, q.options());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const auto *k16 = (const uint16_t*)k_cache.data_ptr(), *v16 = (const uint16_t*)v_cache.data_ptr();
  const float *k32 = (const float*)k_cache.data_ptr(), *v32 = (const float*)v_cache.data_ptr();
  const int64_t q_ld = q.stride(0);
  if (avx512 && avx512_supported()) {  // every supported head size is a multiple of 16
    if (bf16)
      decode<Avx512>(qp, q_ld, k16, v16, lp, tp, width, op, B, Hq, Hkv, D, block_size, window, chunk, (float)scale);
    else
      decode<Avx512>(qp, q_ld, k32, v32, lp, tp, width, op, B, Hq, Hkv, D, block_size, window, chunk, (float)scale);
  } else if (bf16) {
    decode<Avx2>(qp, q_ld, k16, v16, lp, tp, width, op, B, Hq, Hkv, D, block_size, window, chunk, (float)scale);
  } else {
    decode<Avx2>(qp, q_ld, k32, v32, lp, tp, width, op, B, Hq, Hkv, D, block_size, window, chunk, (float)scale);
  }
  return out;
}

bool prefill_supported(int64_t head_dim) {
  return avx512_supported() && head_dim % PREFILL_DT == 0 && head_dim <= 512;
}

// The tiles of a step, dealt to the threads longest first, each to the least loaded (a tile's cost is the
// keys it reads): causal tiles differ in cost, and equal shares keep both cores busy to the end.
static std::vector<std::vector<PrefillTile>> deal(const int32_t* cu, const int32_t* lens, int64_t B, int64_t Hkv,
                                                  int64_t group, int64_t window, int64_t chunk, int threads) {
  std::vector<PrefillTile> tiles;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = cu[b + 1] - cu[b], first_query = lens[b] - q_len, rows = q_len * group;
    for (int64_t r0 = 0; r0 < rows; r0 += PREFILL_ROWS)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t n = std::min<int64_t>(PREFILL_ROWS, rows - r0);
        tiles.push_back({b, h, r0, n, first_visible_key(first_query + r0 / group, window, chunk),
                         first_query + (r0 + n - 1) / group + 1});
      }
  }
  auto cost = [](const PrefillTile& t) { return t.keys - t.first_key; };
  std::stable_sort(tiles.begin(), tiles.end(),
                   [&](const PrefillTile& a, const PrefillTile& b) { return cost(a) > cost(b); });
  std::vector<std::vector<PrefillTile>> per_thread(std::max(1, std::min<int>(threads, (int)tiles.size())));
  std::vector<int64_t> load(per_thread.size(), 0);
  for (const PrefillTile& tile : tiles) {
    const size_t t = std::min_element(load.begin(), load.end()) - load.begin();
    per_thread[t].push_back(tile);
    load[t] += cost(tile) + 16;  // + the tile's fixed work (its queries in, its output out)
  }
  return per_thread;
}

template <class V, class Q, class T>
static void prefill(const std::vector<std::vector<PrefillTile>>& per_thread, const PrefillArgs<Q, T>& args) {
  at::parallel_for(0, (int64_t)per_thread.size(), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t t = begin; t < end; ++t)
      for (const PrefillTile& tile : per_thread[t]) PrefillKernel<V, Q, T>::run(args, tile, scratch);
  });
}

// Causal prefill attention, the contract of reference.append_prefill_attention: queries q [T, Hq, D] of the
// sequences' new tokens (cu_seqlens_q), fp32 over an fp32 or bf16 pool, or bf16 over a bf16 pool
// (avx512_bf16; bf16 output). window, chunk: the reference's masks (0: none).
torch::Tensor paged_prefill_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                      torch::Tensor cu_seqlens_q, torch::Tensor seq_lens, torch::Tensor block_tables,
                                      double scale, int64_t window, int64_t chunk) {
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
  TORCH_CHECK(window >= 0 && chunk >= 0, "paged_prefill_attention: window and chunk are sizes (0: none)");
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
  const auto per_thread = deal(cp, lp, B, Hkv, Hq / Hkv, window, chunk, at::get_num_threads());
  const auto *k16 = (const uint16_t*)k_cache.data_ptr(), *v16 = (const uint16_t*)v_cache.data_ptr();
  const float *k32 = (const float*)k_cache.data_ptr(), *v32 = (const float*)v_cache.data_ptr();
  const int64_t q_ld = q.stride(0);
  if (bf16_q)
    prefill<Avx512Bf16>(per_thread, PrefillArgs<uint16_t, uint16_t>{(const uint16_t*)q.data_ptr(), q_ld, k16, v16,
                        cp, lp, tp, width, block_size, Hq, Hkv, D, window, chunk, (float)scale,
                        (uint16_t*)out.data_ptr()});
  else if (bf16)
    prefill<Avx512>(per_thread, PrefillArgs<float, uint16_t>{q.data_ptr<float>(), q_ld, k16, v16, cp, lp, tp, width,
                    block_size, Hq, Hkv, D, window, chunk, (float)scale, out.data_ptr<float>()});
  else
    prefill<Avx512>(per_thread, PrefillArgs<float, float>{q.data_ptr<float>(), q_ld, k32, v32, cp, lp, tp, width,
                    block_size, Hq, Hkv, D, window, chunk, (float)scale, out.data_ptr<float>()});
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
