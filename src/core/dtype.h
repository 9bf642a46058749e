// Element types of weights and activations, and scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace sluice {

// F8_E4M3: float8 e4m3fn (torch.float8_e4m3fn), 1 sign, 4 exponent (bias 7), 3 mantissa bits,
// no infinities, S.1111.111 is NaN, largest finite ±448. In weights it always comes with block
// scales (Tensor::block_scales, kernels/cpu/gemm_fp8.h).
enum class DType : uint8_t { F32, F16, BF16, I32, I64, U8, I8, F8_E4M3 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
std::optional<DType> parse_dtype(std::string_view safetensors_name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch's .to(torch.bfloat16) does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// float8 e4m3fn: exact widening (every e4m3 value is an fp32, and a bf16, value), and rounding
// to nearest even as torch's .to(torch.float8_e4m3fn) does: magnitudes past 464 (halfway
// between 448 and the NaN code) become NaN, since the format has no infinity.
float fp8_e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f);

// Converts n elements of type `t` starting at `src` into fp32.
void to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace sluice
