// What each instruction set's unit (cpu_avx2.cpp, cpu_avx512.cpp, cpu_avx512_bf16.cpp) provides to the
// torch side of the kernels (cpu_gemm.cpp, cpu_attention.cpp, cpu_layer_ops.cpp), which checks the
// arguments and the CPU, allocates the outputs and shares the work between threads. The kernels' bodies are
// in cpu_gemm.h, cpu_decode.h, cpu_prefill.h and cpu_layer_ops.h.
#pragma once
#include "cpu_simd.h"

// The panel linears: NR output columns a panel (two vectors), blocks of up to MR rows of x (2 MR
// accumulators), STEP values of k a lane (1: fp32; 2: bf16 (k, k + 1) pairs, for VDPBF16PS).
struct PanelsAvx2 {
  using V = Avx2;
  using T = float;
  static constexpr int64_t NR = 16, MR = 6, STEP = 1;  // 12 accumulators, leaving registers for the panel
};
struct PanelsAvx512 {
  using V = Avx512;
  using T = float;
  static constexpr int64_t NR = 32, MR = 14, STEP = 1;  // 28 accumulators of the 32 registers
};
struct PanelsAvx512Bf16 {
  using V = Avx512Bf16;
  using T = uint16_t;
  static constexpr int64_t NR = 32, MR = 14, STEP = 2;
};

template <class P>
struct PanelKernel {
  using T = typename P::T;
  // y[0:M, 0:cols] = x[0:M, 0:K] . panel (+ bias), a row of y every ldy; `next`: the panel to prefetch
  // meanwhile, or null. glu_rows: the panel's low NR / 2 columns are gate, its high ones the matching up,
  // and y[0:M, 0:cols] = silu(gate) * up.
  static void rows(const T* x, int64_t M, int64_t K, const T* panel, const T* next, const float* bias, T* y,
                   int64_t ldy, int64_t cols);
  static void glu_rows(const T* x, int64_t M, int64_t K, const T* panel, const T* next, const float* bias, T* y,
                       int64_t ldy, int64_t cols);
};

// The first key position a query at position pos sees: pos - window + 1 in a sliding window (window > 0),
// the start of its chunk in chunked attention (chunk > 0), the later of the two; 0 with neither. Every
// kernel reads a query's keys from there to its own position.
inline int64_t first_visible_key(int64_t pos, int64_t window, int64_t chunk) {
  int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  if (chunk > 0) first = std::max(first, pos / chunk * chunk);
  return first;
}

// Decode attention, one work item: a sequence's KV heads first_kv .. first_kv + kv_heads - 1 and the query
// heads that read them (query head j of KV head h: h * group + j).
template <class T>  // the pool's element: float, or uint16_t holding bf16
struct DecodeItem {
  const float* q;        // the sequence's query row (heads contiguous, D apart)
  const T *k, *v;        // the pools: slot s, KV head h at s * stride + h * D
  const int32_t* table;  // the sequence's block table
  int64_t first, length;  // the keys read: positions first .. length - 1 (first_visible_key of the query)
  int64_t block_size, stride, first_kv, kv_heads, group, D;
  float scale;
  float* out;  // the sequence's output row
};

template <class V, class T>
struct DecodeKernel {
  static void run(const DecodeItem<T>& item, std::vector<float>& scratch);
};

// Prefill attention: tiles of PREFILL_ROWS query rows (query positions x the query heads of one KV head);
// head_dim a multiple of PREFILL_DT.
constexpr int PREFILL_ROWS = 48, PREFILL_DT = 8;

struct PrefillTile {  // query rows first_row .. first_row + rows - 1 of one sequence and KV head
  int64_t seq, kv_head, first_row, rows;
  int64_t first_key, keys;  // the keys the tile reads: positions first_key .. keys - 1
};

template <class Q, class T>  // the queries' and output's element, the pool's
struct PrefillArgs {
  const Q* q;  // [tokens, Hq, D], a token every q_ld
  int64_t q_ld;
  const T *k_cache, *v_cache;  // [blocks, block_size, Hkv, D]
  const int32_t *cu, *lens, *tables;
  int64_t width, block_size, Hq, Hkv, D;
  int64_t window, chunk;  // the mask (first_visible_key); 0: none
  float scale;
  Q* out;  // [tokens, Hq, D]
};

template <class V, class Q, class T>
struct PrefillKernel {
  static void run(const PrefillArgs<Q, T>& args, const PrefillTile& tile, std::vector<float>& scratch);
};

// A decoder layer's small operations on one row.
template <class V, class T>
struct RowOps {
  static void norm(const T* r, const T* w, T* y, int64_t H, float eps);  // RMSNorm
  static void add_norm(const T* a, const T* b, T* sum, const T* w, T* y, int64_t H, float eps);  // sum = a + b
  static void silu_mul(const T* gate, const T* up, T* y, int64_t I);
  static void rope(const T* x, const T* cos, const T* signed_sin, T* y, int64_t heads, int64_t D);  // a token
};
