#include "kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

namespace sluice::cpu {
namespace {

TEST(CpuSiluMul, MatchesReferenceOverAwkwardSizes) {
  for (int64_t n : {1, 15, 16, 17, 100, 14336, 70000 + 5}) {
    auto gate = test::random_floats(size_t(n), uint32_t(n), 4.0f);
    auto up = test::random_floats(size_t(n), uint32_t(n) + 1);
    std::vector<float> out(static_cast<size_t>(n)), ref(out.size());
    silu_mul(gate.data(), up.data(), out.data(), n);
    silu_mul_reference(gate.data(), up.data(), ref.data(), n);
    // The vector exp is accurate to ~2e-7 relative; silu·up adds a few roundings.
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(out[size_t(i)], ref[size_t(i)], 1e-6 * std::abs(ref[size_t(i)]) + 1e-30)
          << "n=" << n << " gate=" << gate[size_t(i)];
  }
}

TEST(CpuSiluMul, ExtremeInputsSaturate) {
  std::vector<float> gate = {-200.0f, -90.0f, 0.0f, 90.0f, 200.0f}, up(5, 2.0f), out(5);
  silu_mul(gate.data(), up.data(), out.data(), 5);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 0.0f, 1e-30);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_FLOAT_EQ(out[3], 180.0f);
  EXPECT_FLOAT_EQ(out[4], 400.0f);
}

}  // namespace
}  // namespace sluice::cpu
