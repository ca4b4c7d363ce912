// The kernels instantiated for AVX-512 (avx512f), compiled inside its target pragma: nothing here runs
// unless the callers found the CPU has it (avx512_supported). The fp32 panel linear, decode attention and
// the fp32 prefill tiles (over an fp32 or a bf16 pool).
#include "cpu_simd.h"  // the system headers and the traits, outside the target region

#pragma GCC push_options
#pragma GCC target("avx512f")

#include "cpu_decode.h"
#include "cpu_gemm.h"
#include "cpu_prefill.h"

template struct PanelKernel<PanelsAvx512>;
template struct DecodeKernel<Avx512, float>;
template struct DecodeKernel<Avx512, uint16_t>;
template struct PrefillKernel<Avx512, float, float>;
template struct PrefillKernel<Avx512, float, uint16_t>;

#pragma GCC pop_options
