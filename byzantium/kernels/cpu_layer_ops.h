// The small operations of a decoder layer on one row, each one pass (RowOps in cpu_kernels.h): RMSNorm (with
// the residual add before it), SiLU(gate) * up and the rotary embedding. Instantiated for fp32 rows on AVX2
// and bf16 rows on avx512_bf16 (its round-to-nearest-even conversion). In torch each is four to seven
// operators, every one a pass over memory and a dispatch: in a decode step of a few rows the dispatches cost
// more than the arithmetic, in a prefill the passes do. The arithmetic is fp32; bf16 results are rounded
// where torch's bf16 operators round (norm: the normalised row before the weight, then the product; the
// residual sum), so they match the torch formula up to the order of the fp32 sum of squares. Rope rounds
// once, where torch rounds each product and the sum; bf16 products are exact in fp32, so only the sum's
// rounding differs.
#pragma once
#include "cpu_kernels.h"
#include "cpu_math.h"

// fn(i, n) over [0, size) in steps of W lanes: n = W, but less for the last step.
template <class V, class F>
inline void for_lanes(int64_t size, F fn) {
  int64_t i = 0;
  for (; i + V::W <= size; i += V::W) fn(i, V::W);
  if (i < size) fn(i, size - i);
}

template <class V, class T>  // v as a T holds it
inline typename V::Vec as_element(typename V::Vec v) {
  if constexpr (std::is_same<T, uint16_t>::value)
    return V::round_bf16(v);
  else
    return v;
}

// y = w * (r / sqrt(mean(r^2) + eps)), the sum of squares in fp32 (as transformers computes it).
template <class V, class T>
void RowOps<V, T>::norm(const T* r, const T* w, T* y, int64_t H, float eps) {
  typename V::Vec acc = V::zero();
  for_lanes<V>(H, [&](int64_t h, int64_t n) {
    const typename V::Vec v = V::load_n(r + h, n);
    acc = V::fmadd(v, v, acc);
  });
  const typename V::Vec inv = V::set1(1.0f / std::sqrt(V::reduce_add(acc) / H + eps));
  for_lanes<V>(H, [&](int64_t h, int64_t n) {
    V::store_n(y + h, V::mul(V::load_n(w + h, n), as_element<V, T>(V::mul(V::load_n(r + h, n), inv))), n);
  });
}

// sum = a + b (rounded as torch's add), y = RMSNorm(sum).
template <class V, class T>
void RowOps<V, T>::add_norm(const T* a, const T* b, T* sum, const T* w, T* y, int64_t H, float eps) {
  for_lanes<V>(H, [&](int64_t h, int64_t n) {
    V::store_n(sum + h, V::add(V::load_n(a + h, n), V::load_n(b + h, n)), n);
  });
  norm(sum, w, y, H, eps);
}

template <class V, class T>
void RowOps<V, T>::silu_mul(const T* gate, const T* up, T* y, int64_t I) {
  for_lanes<V>(I, [&](int64_t i, int64_t n) {
    V::store_n(y + i, ::silu_mul<V>(V::load_n(gate + i, n), V::load_n(up + i, n)), n);
  });
}

// A token's heads x [heads, D] with cos = cat(c, c) and signed_sin = cat(-s, s) [D]:
// y = x * cos + roll(x, D / 2) * signed_sin.
template <class V, class T>
void RowOps<V, T>::rope(const T* x, const T* cos, const T* signed_sin, T* y, int64_t heads, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const T* v = x + h * D;
    T* out = y + h * D;
    for_lanes<V>(half, [&](int64_t i, int64_t n) {
      const typename V::Vec lo = V::load_n(v + i, n), hi = V::load_n(v + half + i, n);
      V::store_n(out + i, V::add(V::mul(lo, V::load_n(cos + i, n)), V::mul(hi, V::load_n(signed_sin + i, n))), n);
      V::store_n(out + half + i,
                 V::add(V::mul(hi, V::load_n(cos + half + i, n)), V::mul(lo, V::load_n(signed_sin + half + i, n))), n);
    });
  }
}
