// Row conversions between fp32 and bf16 used around the GEMM and the KV cache.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sluice::cpu {

// dst[i] = bf16(src[i]), round to nearest even: bit for bit core/dtype.h f32_to_bf16 (NaN kept
// quiet) at the scalar and avx2 levels; from avx512bf16 up, vcvtneps2bf16 also flushes subnormal
// inputs to a signed zero.
void f32_to_bf16_row(const float* src, uint16_t* dst, size_t n);
// dst[i] = float(src[i]) (exact).
void bf16_to_f32_row(const uint16_t* src, float* dst, size_t n);

}  // namespace sluice::cpu
