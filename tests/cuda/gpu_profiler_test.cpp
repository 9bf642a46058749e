// The GPU profiler on a real GPU: every field measured and within what PCIe, HBM and tensor
// cores can do. Skipped, with a message, on machines without a GPU.
#include "runtime/gpu/gpu_profiler.h"

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_check.h"

namespace sluice {
namespace {

TEST(GpuProfiler, MeasuresSaneValues) {
  SKIP_WITHOUT_GPU("GPU profiler test");
  const std::optional<GpuProfile> g = gpu::measure_gpu_profile();
  ASSERT_TRUE(g.has_value());
  EXPECT_FALSE(g->name.empty());
  // PCIe 3 x16 moves ~12 GB/s, PCIe 5 x16 ~55 GB/s, NVLink-C2C up to ~450 GB/s.
  for (double bw : {g->h2d_pinned_bytes_per_s, g->d2h_pinned_bytes_per_s}) {
    EXPECT_GT(bw, 3e9);
    EXPECT_LT(bw, 5e11);
  }
  EXPECT_GT(g->h2d_pageable_bytes_per_s, 5e8);
  EXPECT_GT(g->d2h_pageable_bytes_per_s, 5e8);
  // Device memory: from GDDR (~300 GB/s) to HBM3e (~5 TB/s).
  EXPECT_GT(g->memory_bytes_per_s, 1e11);
  EXPECT_LT(g->memory_bytes_per_s, 1e13);
  EXPECT_GT(g->memory_free_bytes, size_t(1) << 30);
  ASSERT_EQ(g->gemm.size(), 3u);
  for (const GemmCurve& c : g->gemm) {
    ASSERT_FALSE(c.points.empty()) << c.name;
    for (size_t i = 0; i < c.points.size(); ++i) {
      EXPECT_GT(c.points[i].seconds, 0) << c.name;
      if (i > 0) {
        EXPECT_GE(c.points[i].seconds, c.points[i - 1].seconds) << c.name;
      }
    }
    // A bf16 GEMM can neither beat ~2 PFLOP/s dense nor read its weights faster than 10 TB/s.
    for (const auto& pt : c.points) {
      EXPECT_LT(2.0 * double(pt.m) * double(c.n) * double(c.k) / pt.seconds, 2.5e15) << c.name;
      EXPECT_LT(2.0 * double(c.n) * double(c.k) / pt.seconds, 1e13) << c.name;
    }
  }
  EXPECT_GT(g->gemm_peak_flops(), 1e13);  // any tensor-core GPU this backend targets (sm_90)
}

}  // namespace
}  // namespace sluice
