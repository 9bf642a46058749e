// Kernels the offload executor needs beyond ops.h: the exact fp32-activation GEMM of the router
// (and of f32 precision), the fp32→bf16 conversion of GEMM inputs, an fp32 row gather, and the
// dequantisation of FP8 weight panels ahead of a bf16 GEMM.
// Device pointers; each enqueues on `stream` and returns at once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sluice::cuda {

// cpu::gemm_f32: Y[m, n] = X[m, k] · W[n, k]ᵀ + beta · Y with fp32 X (not rounded) and bf16 W,
// fp32 sums; Y's rows `ldy` apart (0: n). One warp per output: meant for the router
// (n = experts); correct but slow for the large GEMMs of f32 precision, which is a checking mode.
void gemm_f32_bf16w(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                    float beta, cudaStream_t stream, int64_t ldy = 0);

// cpu::dequantize_fp8 of rows [row0, row0 + rows) of an FP8 e4m3 matrix with 128 × 128 block
// scales (codes q [n, k], scales [⌈n/128⌉, ⌈k/128⌉]) into out [rows, k] bf16: bf16(float(code) ·
// scale), rounded to nearest even, bit for bit the CPU's.
void dequantize_fp8(const uint8_t* q, const float* scale, int64_t k, int64_t row0, int64_t rows,
                    uint16_t* out, cudaStream_t stream);

// cpu::f32_to_bf16_row over n elements: round to nearest even, NaN kept a NaN.
void f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);

// dst[j] = src[rows[j]] for j < n, rows of `cols` floats.
void gather_rows_f32(const float* src, int64_t cols, const int32_t* rows, int64_t n, float* dst,
                     cudaStream_t stream);

}  // namespace sluice::cuda
