// The kernels instantiated for bf16 on CPUs with avx512_bf16 (AMD Zen 4 and later, Intel Cooper Lake,
// Sapphire Rapids and later), compiled inside its target pragma: nothing here runs unless the callers found
// the CPU has it (avx512_bf16_supported). The bf16 panel linear, the bf16 prefill tiles and the bf16 layer
// ops.
#include "cpu_simd.h"  // the system headers and the traits, outside the target region

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

#include "cpu_gemm.h"
#include "cpu_layer_ops.h"
#include "cpu_prefill.h"

template struct PanelKernel<PanelsAvx512Bf16>;
template struct PrefillKernel<Avx512Bf16, uint16_t, uint16_t>;
template struct RowOps<Avx512Bf16, uint16_t>;

#pragma GCC pop_options
