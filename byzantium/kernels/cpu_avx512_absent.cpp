// Stands in for cpu_avx512.cpp where the CPU has no AVX-512 (cpu_ext.py builds one or the other): the torch
// side names these kernels, but reaches them only after avx512_supported(), which is false on such a CPU,
// so their bodies are never compiled for an instruction set the CPU cannot run. They are defined here as
// explicit specializations, whose symbols are those the explicit instantiations would give.
#include <stdexcept>

#include "cpu_kernels.h"

[[noreturn]] static void no_avx512() {
  throw std::logic_error("byzantium: these CPU kernels were built without AVX-512 (this CPU has none)");
}

template <> void PanelKernel<PanelsAvx512>::rows(const float*, int64_t, int64_t, const float*, const float*,
                                                 const float*, float*, int64_t, int64_t) { no_avx512(); }
template <> void PanelKernel<PanelsAvx512>::glu_rows(const float*, int64_t, int64_t, const float*, const float*,
                                                     const float*, float*, int64_t, int64_t) { no_avx512(); }
template <> void DecodeKernel<Avx512, float>::run(const DecodeItem<float>&, std::vector<float>&) { no_avx512(); }
template <> void DecodeKernel<Avx512, uint16_t>::run(const DecodeItem<uint16_t>&, std::vector<float>&) {
  no_avx512();
}
template <> void PrefillKernel<Avx512, float, float>::run(const PrefillArgs<float, float>&, const PrefillTile&,
                                                          std::vector<float>&) { no_avx512(); }
template <> void PrefillKernel<Avx512, float, uint16_t>::run(const PrefillArgs<float, uint16_t>&, const PrefillTile&,
                                                             std::vector<float>&) { no_avx512(); }
