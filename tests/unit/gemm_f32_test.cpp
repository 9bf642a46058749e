#include "kernels/cpu/gemm_f32.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

void expect_matches_reference_over_awkward_sizes() {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto [m, n, k] : {std::tuple{1, 1, 1},
                         {3, 17, 33},
                         {17, 8, 130},
                         {5, 23, 96},
                         {2, 9, 4097},
                         {9, 100, 2100}}) {
    std::vector<float> x(size_t(m) * k), y(size_t(m) * n), ref(size_t(m) * n);
    std::vector<uint16_t> w(size_t(n) * k);
    for (float& v : x) v = u(rng);
    for (uint16_t& v : w) v = f32_to_bf16(u(rng));
    for (float beta : {0.0f, 1.0f}) {
      for (size_t i = 0; i < y.size(); ++i) y[i] = ref[i] = u(rng);
      gemm_f32({m, n, k, x.data(), w.data(), y.data(), beta});
      gemm_f32_reference({m, n, k, x.data(), w.data(), ref.data(), beta});
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_NEAR(y[i], ref[i], 2e-6f * std::sqrt(float(k)) + 1e-6f * std::fabs(ref[i]))
            << "m=" << m << " n=" << n << " k=" << k << " beta=" << beta << " at " << i;
    }
  }
}

TEST(GemmF32, MatchesTheScalarReferenceOverAwkwardSizesAtEveryLevel) {
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel scoped(level);
    SCOPED_TRACE(isa_name(level));
    expect_matches_reference_over_awkward_sizes();
  }
}

TEST(GemmF32, KeepsActivationsInFp32) {
  // 1 + 2^-10 is not a bf16 value: a bf16 GEMM would see 1.0 and return 1.0.
  const float x[] = {1.0f + 1.0f / 1024};
  const uint16_t w[] = {f32_to_bf16(1.0f)};
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel scoped(level);
    float y[1];
    gemm_f32({1, 1, 1, x, w, y, 0.0f});
    EXPECT_EQ(y[0], 1.0f + 1.0f / 1024) << isa_name(level);
  }
}

}  // namespace
}  // namespace sluice::cpu
