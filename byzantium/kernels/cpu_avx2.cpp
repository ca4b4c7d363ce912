// The kernels instantiated for AVX2 + FMA, the build's own flags: the fp32 panel linear, decode attention
// (where the CPU or the head size rules out AVX-512, or when asked for) and the fp32 layer ops.
#include "cpu_simd.h"
#include "cpu_decode.h"
#include "cpu_gemm.h"
#include "cpu_layer_ops.h"

template struct PanelKernel<PanelsAvx2>;
template struct DecodeKernel<Avx2, float>;
template struct DecodeKernel<Avx2, uint16_t>;
template struct RowOps<Avx2, float>;
