#include "kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernel_test_util.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/simd_avx512.h"

namespace sluice::cpu {
namespace {

TEST(CpuSiluMul, MatchesReferenceOverAwkwardSizes) {
  for (IsaLevel level : isa_levels_up_to_current())
    for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 31, 100, 129, 14336, 70000 + 5}) {
      auto gate = test::random_floats(size_t(n), uint32_t(n), 4.0f);
      auto up = test::random_floats(size_t(n), uint32_t(n) + 1);
      std::vector<float> out(static_cast<size_t>(n)), ref(out.size());
      {
        ScopedIsaLevel at(level);
        silu_mul(gate.data(), up.data(), out.data(), n);
      }
      silu_mul_reference(gate.data(), up.data(), ref.data(), n);
      // The vector exp is accurate to 1 ulp (< 8e-8 relative); silu·up adds a few roundings.
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(out[size_t(i)], ref[size_t(i)], 1e-6 * std::abs(ref[size_t(i)]) + 1e-30)
            << isa_name(level) << " n=" << n << " gate=" << gate[size_t(i)];
    }
}

TEST(CpuSiluMul, ExtremeInputsSaturate) {
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel at(level);
    std::vector<float> gate = {-200.0f, -90.0f, 0.0f, 90.0f, 200.0f}, up(5, 2.0f), out(5);
    silu_mul(gate.data(), up.data(), out.data(), 5);
    EXPECT_EQ(out[0], 0.0f) << isa_name(level);
    EXPECT_NEAR(out[1], 0.0f, 1e-30) << isa_name(level);
    EXPECT_EQ(out[2], 0.0f) << isa_name(level);
    EXPECT_FLOAT_EQ(out[3], 180.0f) << isa_name(level);
    EXPECT_FLOAT_EQ(out[4], 400.0f) << isa_name(level);
  }
}

// ---- The vector exp of simd_avx2.h / simd_avx512.h against the correctly rounded exp. ----

SLUICE_AVX2 void exp_avx2(const float* x, float* y, size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, avx2::exp_ps(_mm256_loadu_ps(x + i)));
}

SLUICE_AVX512 void exp_avx512(const float* x, float* y, size_t n) {
  for (size_t i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, avx512::exp_ps(_mm512_loadu_ps(x + i)));
}

// Distance in units in the last place between two finite floats of the same sign.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(int64_t(ia) - int64_t(ib));
}

// Every float in [-104, 89] with a 12-bit step in the encoding (~500k inputs), plus the ends.
std::vector<float> exp_inputs() {
  std::vector<float> x;
  for (uint32_t bits = 0; bits < 0x42d00000u; bits += 4096) {  // +0 .. +104
    float f;
    std::memcpy(&f, &bits, 4);
    if (f <= 89.0f) x.push_back(f);
    x.push_back(-f);
  }
  for (float f : {88.72f, 88.73f, -87.33f, -103.2f, -103.3f, -104.0f, 89.0f, 0.0f}) x.push_back(f);
  while (x.size() % 16 != 0) x.push_back(0.0f);
  return x;
}

void expect_exp_accuracy(void (*exp_fn)(const float*, float*, size_t), const char* name) {
  const std::vector<float> x = exp_inputs();
  std::vector<float> y(x.size());
  exp_fn(x.data(), y.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float expected = float(std::exp(double(x[i])));
    if (std::isinf(expected) || expected < std::numeric_limits<float>::min()) {
      // Overflow saturates to +inf; subnormal results are within one subnormal step.
      if (std::isinf(expected))
        ASSERT_TRUE(std::isinf(y[i])) << name << " exp(" << x[i] << ") = " << y[i];
      else
        ASSERT_NEAR(y[i], expected, std::numeric_limits<float>::denorm_min())
            << name << " exp(" << x[i] << ")";
      continue;
    }
    ASSERT_LE(ulps(y[i], expected), 1)
        << name << " exp(" << x[i] << ") = " << y[i] << ", expected " << expected;
  }
}

TEST(CpuVectorExp, WithinOneUlpOfTheCorrectlyRoundedExp) {
  if (isa_at_least(IsaLevel::kAvx2)) expect_exp_accuracy(exp_avx2, "avx2");
  if (isa_at_least(IsaLevel::kAvx512)) expect_exp_accuracy(exp_avx512, "avx512");
  if (!isa_at_least(IsaLevel::kAvx2)) GTEST_SKIP() << "no vector exp below avx2";
}

}  // namespace
}  // namespace sluice::cpu
