#include "core/dtype.h"

#include <array>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace sluice {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, 8> kDTypes = {{{DType::F32, "F32", 4},
                                               {DType::F16, "F16", 2},
                                               {DType::BF16, "BF16", 2},
                                               {DType::I32, "I32", 4},
                                               {DType::I64, "I64", 8},
                                               {DType::U8, "U8", 1},
                                               {DType::I8, "I8", 1},
                                               {DType::F8_E4M3, "F8_E4M3", 1}}};
}  // namespace

size_t dtype_size(DType t) {
  return kDTypes[size_t(t)].size;
}
std::string_view dtype_name(DType t) {
  return kDTypes[size_t(t)].name;
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& info : kDTypes)
    if (info.name == name) return info.type;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int shift = 0;
      while (!(mantissa & 0x400u)) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ffu;
      bits = sign | uint32_t(127 - 15 - shift + 1) << 23 | mantissa << 13;
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00u;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < 6.103515625e-05f) {                // subnormal half: multiples of 2^-24
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  uint32_t abits = bits & 0x7fffffffu;
  // Round mantissa from 23 to 10 bits, to nearest even.
  abits += 0xfffu + ((abits >> 13) & 1u);
  uint32_t exponent = (abits >> 23) - 127 + 15;
  return sign | uint16_t(exponent << 10 | ((abits >> 13) & 0x3ffu));
}

float fp8_e4m3_to_f32(uint8_t v) {
  const int magnitude = v & 0x7f, exponent = magnitude >> 3, mantissa = magnitude & 7;
  float a;
  if (magnitude == 0x7f)
    a = std::numeric_limits<float>::quiet_NaN();
  else if (exponent == 0)
    a = std::ldexp(float(mantissa), -9);  // subnormal: m · 2^-6 / 8
  else
    a = std::ldexp(float(8 + mantissa), exponent - 7 - 3);
  return (v & 0x80) ? -a : a;
}

uint8_t f32_to_fp8_e4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (std::isnan(f) || a > 464.0f) return sign | 0x7f;  // 464 is the tie between 448 and NaN
  if (a < 0.015625f)  // below 2^-6, the subnormals: multiples of 2^-9 (8 · 2^-9 is 0x08)
    return sign | uint8_t(std::nearbyint(a * 512.0f));
  uint32_t bits;
  std::memcpy(&bits, &a, 4);
  bits += 0x7ffffu + ((bits >> 20) & 1u);  // mantissa from 23 to 3 bits, to nearest even
  const uint32_t exponent = (bits >> 23) - 127 + 7;
  return sign | uint8_t(exponent << 3 | ((bits >> 20) & 7u));
}

void to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::F8_E4M3: {  // the stored values, without their block scales
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = fp8_e4m3_to_f32(s[i]);
      return;
    }
    default:
      fail("cannot convert {} tensor data to F32", dtype_name(t));
  }
}

}  // namespace sluice
