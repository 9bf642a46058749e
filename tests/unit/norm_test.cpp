#include "kernels/cpu/norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

TEST(CpuRmsNorm, MatchesReferenceOverAwkwardSizes) {
  for (IsaLevel level : isa_levels_up_to_current())
    for (int64_t dim : {1, 3, 7, 8, 9, 15, 16, 17, 31, 100, 129, 4096, 5120 + 3})
      for (int64_t rows : {1, 5})
        for (DType wt : {DType::BF16, DType::F32}) {
          const int64_t stride = dim + 3;
          auto x = test::random_floats(size_t(rows * stride), uint32_t(dim), 3.0f);
          auto wf = test::random_floats(size_t(dim), uint32_t(dim) + 1);
          auto wb = test::random_bf16(size_t(dim), uint32_t(dim) + 1);
          std::vector<float> y(size_t(rows * dim)), ref(y.size());
          RmsNormArgs args{
              .x = x.data(),
              .y = y.data(),
              .rows = rows,
              .dim = dim,
              .weight = wt == DType::F32 ? static_cast<const void*>(wf.data()) : wb.data(),
              .weight_dtype = wt,
              .eps = 1e-6f,
              .x_stride = stride};
          {
            ScopedIsaLevel at(level);
            rms_norm(args);
          }
          args.y = ref.data();
          rms_norm_reference(args);
          // fp32 sum of squares over up to 5k elements vs double: ~1e-6 relative.
          for (size_t i = 0; i < y.size(); ++i)
            ASSERT_NEAR(y[i], ref[i], 4e-6 * std::abs(ref[i]) + 1e-7)
                << isa_name(level) << " dim=" << dim << " rows=" << rows << " i=" << i;
        }
}

TEST(CpuRmsNorm, UnitWeightGivesUnitRms) {
  const int64_t dim = 37;
  auto x = test::random_floats(size_t(dim), 9, 5.0f);
  std::vector<float> w(size_t(dim), 1.0f);
  rms_norm({.x = x.data(),
            .y = x.data(),
            .rows = 1,
            .dim = dim,
            .weight = w.data(),
            .weight_dtype = DType::F32,
            .eps = 0.0f});  // in place
  double sum = 0;
  for (float v : x) sum += double(v) * v;
  EXPECT_NEAR(sum / double(dim), 1.0, 1e-6);
}

TEST(CpuRmsNorm, RejectsBadWeightType) {
  float x = 1, y = 0;
  int32_t w = 1;
  EXPECT_THROW(
      rms_norm({.x = &x, .y = &y, .rows = 1, .dim = 1, .weight = &w, .weight_dtype = DType::I32}),
      Error);
}

// Rows off zero (mean ~2) so the centring matters; strided input, in place and not.
TEST(CpuLayerNorm, MatchesReferenceOverAwkwardSizes) {
  for (int64_t dim : {1, 2, 3, 7, 16, 17, 100, 129, 4096, 5120 + 3})
    for (int64_t rows : {1, 5})
      for (DType wt : {DType::BF16, DType::F32}) {
        const int64_t stride = dim + 3;
        auto x = test::random_floats(size_t(rows * stride), uint32_t(dim) + 7, 3.0f);
        for (float& v : x) v += 2.0f;
        auto wf = test::random_floats(size_t(dim), uint32_t(dim) + 1);
        auto wb = test::random_bf16(size_t(dim), uint32_t(dim) + 1);
        std::vector<float> y(size_t(rows * dim)), ref(y.size());
        RmsNormArgs args{
            .x = x.data(),
            .y = y.data(),
            .rows = rows,
            .dim = dim,
            .weight = wt == DType::F32 ? static_cast<const void*>(wf.data()) : wb.data(),
            .weight_dtype = wt,
            .eps = 1e-5f,
            .x_stride = stride};
        layer_norm(args);
        args.y = ref.data();
        layer_norm_reference(args);
        // fp32 sums over up to 5k elements of ~2 ± 3 vs double: the mean is off by ~1e-6 of
        // the row's scale, which the centred values carry.
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_NEAR(y[i], ref[i], 1e-5 * std::abs(ref[i]) + 1e-5)
              << "dim=" << dim << " rows=" << rows << " i=" << i;
      }
}

TEST(CpuLayerNorm, UnitWeightGivesZeroMeanUnitVarianceInPlace) {
  const int64_t dim = 37;
  auto x = test::random_floats(size_t(dim), 11, 5.0f);
  for (float& v : x) v += 4.0f;
  std::vector<float> w(size_t(dim), 1.0f);
  layer_norm({.x = x.data(),
              .y = x.data(),
              .rows = 1,
              .dim = dim,
              .weight = w.data(),
              .weight_dtype = DType::F32,
              .eps = 0.0f});
  double sum = 0, squares = 0;
  for (float v : x) sum += v;
  for (float v : x) squares += double(v) * v;
  EXPECT_NEAR(sum / double(dim), 0.0, 1e-6);
  EXPECT_NEAR(squares / double(dim), 1.0, 1e-5);
}

}  // namespace
}  // namespace sluice::cpu
