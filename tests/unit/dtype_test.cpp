#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/isa.h"

namespace sluice {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half way between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3·2^-8 is half way too: rounds up to the even mantissa 0x02.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << "half bits " << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);                   // overflows to infinity
}

TEST(DType, ParsesSafetensorsNames) {
  EXPECT_EQ(parse_dtype("BF16"), DType::BF16);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::F8_E4M3);
  EXPECT_EQ(dtype_size(DType::F8_E4M3), 1u);
  EXPECT_FALSE(parse_dtype("F8_E5M2").has_value());
}

// ---- Row conversions of kernels/cpu/convert.h, at every ISA level, bit for bit. ----

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Lengths below, at and around the vector widths (8 and 16), so every tail is exercised.
constexpr size_t kAwkwardLengths[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 129};

TEST(CpuConvert, Bf16ToF32IsExactForEveryBitPattern) {
  std::vector<uint16_t> src(0x10000 + 3);
  for (uint32_t h = 0; h < 0x10000; ++h) src[h + 3] = uint16_t(h);  // from an odd offset
  for (cpu::IsaLevel level : cpu::isa_levels_up_to_current()) {
    cpu::ScopedIsaLevel at(level);
    std::vector<float> dst(src.size());
    cpu::bf16_to_f32_row(src.data() + 3, dst.data(), 0x10000);
    for (uint32_t h = 0; h < 0x10000; ++h) {
      uint32_t bits;
      std::memcpy(&bits, &dst[h], 4);
      ASSERT_EQ(bits, h << 16) << cpu::isa_name(level) << " bf16 bits " << h;
    }
    for (size_t n : kAwkwardLengths) {
      std::vector<float> part(n + 1, -7.0f);
      cpu::bf16_to_f32_row(src.data() + 100, part.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(part[i], bf16_to_f32(src[100 + i])) << n;
      ASSERT_EQ(part[n], -7.0f) << cpu::isa_name(level) << " wrote past n=" << n;
    }
  }
}

// Ties in both directions, values that round up into the next binade and to infinity, zeros,
// subnormals, infinities and NaNs (quiet, signalling, with payloads), then a sweep through every
// exponent with a stride co-prime to the mantissa.
std::vector<float> bf16_rounding_inputs() {
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80ffffu, 0x3fffffffu,
                                0x7f7fffffu, 0x7f7f8000u, 0xff7fffffu, 0x00000000u, 0x80000000u,
                                0x00000001u, 0x007fffffu, 0x80400000u, 0x7f800000u, 0xff800000u,
                                0x7fc00000u, 0x7f800001u, 0xffc12345u, 0x7fbfffffu, 0x7f808000u};
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 4099) bits.push_back(uint32_t(b));
  std::vector<float> x;
  for (uint32_t b : bits) x.push_back(from_bits(b));
  return x;
}

TEST(CpuConvert, F32ToBf16RoundsLikeTheScalarConversion) {
  const std::vector<float> src = bf16_rounding_inputs();
  for (cpu::IsaLevel level : cpu::isa_levels_up_to_current()) {
    cpu::ScopedIsaLevel at(level);
    // vcvtneps2bf16 (the avx512bf16 path) treats subnormal inputs as zero; nothing else may differ.
    const bool flushes_subnormals = level >= cpu::IsaLevel::kAvx512Bf16;
    std::vector<uint16_t> dst(src.size());
    cpu::f32_to_bf16_row(src.data(), dst.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      const uint16_t expected = f32_to_bf16(src[i]);
      if (flushes_subnormals && std::fpclassify(src[i]) == FP_SUBNORMAL)
        ASSERT_EQ(dst[i], std::signbit(src[i]) ? 0x8000u : 0u)
            << cpu::isa_name(level) << " at " << i;
      else
        ASSERT_EQ(dst[i], expected) << cpu::isa_name(level) << " input " << src[i] << " at " << i;
    }
    for (size_t n : kAwkwardLengths) {
      std::vector<uint16_t> part(n + 1, 0xdead);
      cpu::f32_to_bf16_row(src.data() + 100000, part.data(), n);  // normal values
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(part[i], f32_to_bf16(src[100000 + i])) << n;
      ASSERT_EQ(part[n], 0xdead) << cpu::isa_name(level) << " wrote past n=" << n;
    }
  }
}

}  // namespace
}  // namespace sluice
