// cpu::gemm_int8 on the GPU: Y = X · dequant(W)ᵀ + beta · Y against the packed int8 or int4
// expert weights (cpu::QuantView's layout, as the host holds and streams them), with X quantized
// to int8 per row and group on the fly, and the same arithmetic as the CPU kernel bit for bit:
// for each group in increasing order the exact int32 dot product d (here `__dp4a`), then
// acc = fma(float(d), sx · sw, acc), and y = beta == 0 ? acc : fma(beta, y, acc).
// Device pointers; enqueues on `stream` and returns at once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sluice::cuda {

struct QuantGemmArgs {
  bool int4 = false;  // values as int4 nibbles (else int8)
  int64_t m = 0, n = 0, k = 0, group = 0;
  const uint8_t* values = nullptr;  // packed values (cpu::QuantView::values())
  const float* scales = nullptr;    // [block][k / group][16 rows] (cpu::QuantView::scales())
  const void* x = nullptr;          // [m, k], row stride ldx: bf16 (x_bf16) or fp32
  bool x_bf16 = true;
  int64_t ldx = 0;
  float* y = nullptr;  // fp32 [m, n], row stride ldy
  int64_t ldy = 0;
  float beta = 0.0f;
};

// Shapes as cpu::check_quant_shape accepts them (group a multiple of 4, or 8 for int4, at most
// 1024, dividing k).
void gemm_quant(const QuantGemmArgs& args, cudaStream_t stream);

}  // namespace sluice::cuda
