// Row conversions between fp32 and bf16 used around the GEMM and the KV cache.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sluice::cpu {

// dst[i] = bf16(src[i]), round to nearest even (same as core/dtype.h f32_to_bf16 for non-NaN).
void f32_to_bf16_row(const float* src, uint16_t* dst, size_t n);
// dst[i] = float(src[i]) (exact).
void bf16_to_f32_row(const uint16_t* src, float* dst, size_t n);

}  // namespace sluice::cpu
