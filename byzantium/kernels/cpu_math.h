// exp and SiLU over the SIMD traits of cpu_simd.h. Function templates take the instruction set of the
// place they are defined in, so these are included by the kernel bodies (cpu_gemm.h and the others), which
// each instruction set's unit includes inside its target pragmas.
#pragma once
#include "cpu_simd.h"

// exp for x <= 0 (scores minus their max): x = n ln2 + r with |r| <= ln2/2, exp(r) by its degree-6
// Taylor polynomial (relative error ~1e-7), 2^n put straight into the exponent bits; exactly 0 below
// -87, where 2^n would leave the normal range (masked scores are -inf).
template <class V>
inline typename V::Vec exp_nonpositive(typename V::Vec x) {
  const typename V::Mask live = V::at_least(x, V::set1(-87.0f));
  x = V::max(x, V::set1(-87.0f));
  const typename V::Vec n = V::round(V::mul(x, V::set1(1.44269504f)));
  typename V::Vec r = V::fnmadd(n, V::set1(0.693145752f), x);  // ln2 split in two for exactness
  r = V::fnmadd(n, V::set1(1.42860677e-6f), r);
  typename V::Vec p = V::set1(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = V::fmadd(p, r, V::set1(c));
  return V::select(live, V::mul(p, V::pow2(n)), V::zero());
}

// silu(g) * u = g * sigmoid(g) * u, sigmoid from e = exp(-|g|) (never overflows): 1 / (1 + e) for g >= 0,
// e / (1 + e) below.
template <class V>
inline typename V::Vec silu_mul(typename V::Vec g, typename V::Vec u) {
  const typename V::Vec e = exp_nonpositive<V>(V::neg_abs(g)), one = V::set1(1.0f);
  const typename V::Vec numerator = V::select(V::less(g, V::zero()), e, one);
  return V::mul(V::mul(g, V::div(numerator, V::add(one, e))), u);
}
