// Stands in for cpu_avx512_bf16.cpp where the CPU has no avx512_bf16 (cpu_ext.py builds one or the other):
// the torch side names these kernels, but reaches them only after avx512_bf16_supported(), which is false on
// such a CPU. Explicit specializations, as in cpu_avx512_absent.cpp.
#include <stdexcept>

#include "cpu_kernels.h"

[[noreturn]] static void no_avx512_bf16() {
  throw std::logic_error("byzantium: these CPU kernels were built without avx512_bf16 (this CPU has none)");
}

using Bf16 = uint16_t;

template <> void PanelKernel<PanelsAvx512Bf16>::rows(const Bf16*, int64_t, int64_t, const Bf16*, const Bf16*,
                                                     const float*, Bf16*, int64_t, int64_t) { no_avx512_bf16(); }
template <> void PanelKernel<PanelsAvx512Bf16>::glu_rows(const Bf16*, int64_t, int64_t, const Bf16*, const Bf16*,
                                                         const float*, Bf16*, int64_t, int64_t) {
  no_avx512_bf16();
}
template <> void PrefillKernel<Avx512Bf16, Bf16, Bf16>::run(const PrefillArgs<Bf16, Bf16>&, const PrefillTile&,
                                                            std::vector<float>&) { no_avx512_bf16(); }
template <> void RowOps<Avx512Bf16, Bf16>::norm(const Bf16*, const Bf16*, Bf16*, int64_t, float) { no_avx512_bf16(); }
template <> void RowOps<Avx512Bf16, Bf16>::add_norm(const Bf16*, const Bf16*, Bf16*, const Bf16*, Bf16*, int64_t,
                                                    float) { no_avx512_bf16(); }
template <> void RowOps<Avx512Bf16, Bf16>::silu_mul(const Bf16*, const Bf16*, Bf16*, int64_t) { no_avx512_bf16(); }
template <> void RowOps<Avx512Bf16, Bf16>::rope(const Bf16*, const Bf16*, const Bf16*, Bf16*, int64_t, int64_t) {
  no_avx512_bf16();
}
