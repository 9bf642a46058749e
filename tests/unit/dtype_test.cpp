#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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
  EXPECT_FALSE(parse_dtype("F8_E4M3").has_value());
}

}  // namespace
}  // namespace sluice
