#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/gemm_tiled.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

struct Case {
  int64_t m, n, k;
};

// Both sides see identical bf16 inputs and exact bf16 products, so they differ only in the order
// of the fp32 additions. The bound is relative to Σ|x·w|, which is what that order can disturb.
// Which entry point a case runs: gemm() (oneDNN or the tiles, as dispatched), or the tiles alone
// (oneDNN's fallback, which the dispatch leaves untested at the AVX-512 levels for large m).
enum class Path { kDispatched, kTilesOnly };

void expect_matches_reference(const Case& c, DType x_dtype, float beta, int64_t pad,
                              Path path = Path::kDispatched) {
  const int64_t ldx = c.k + pad, ldw = c.k + pad, ldy = c.n + pad;
  auto xf = test::random_floats(size_t(c.m * ldx), 1 + uint32_t(c.m * 7 + c.k));
  auto xb = test::random_bf16(size_t(c.m * ldx), 2 + uint32_t(c.m * 7 + c.k));
  auto w = test::random_bf16(size_t(c.n * ldw), 3 + uint32_t(c.n));
  auto y0 = test::random_floats(size_t(c.m * ldy), 4);
  auto y_fast = y0, y_ref = y0;
  GemmArgs args{.m = c.m,
                .n = c.n,
                .k = c.k,
                .x = x_dtype == DType::F32 ? static_cast<const void*>(xf.data()) : xb.data(),
                .x_dtype = x_dtype,
                .ldx = ldx,
                .w = w.data(),
                .ldw = ldw,
                .y = y_fast.data(),
                .ldy = ldy,
                .beta = beta};
  if (path == Path::kTilesOnly) {
    tiled_gemm({.m = c.m,
                .n = c.n,
                .k = c.k,
                .x = args.x,
                .x_dtype = x_dtype,
                .ldx = ldx,
                .round_x_to_bf16 = true,
                .w = w.data(),
                .ldw = ldw,
                .y = y_fast.data(),
                .ldy = ldy,
                .beta = beta},
               isa_level());
  } else {
    gemm(args);
  }
  SCOPED_TRACE(path == Path::kTilesOnly ? tiled_gemm_name(isa_level()) : gemm_implementation(args));
  args.y = y_ref.data();
  gemm_reference(args);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double magnitude = std::abs(beta * y0[i * ldy + j]);
      for (int64_t p = 0; p < c.k; ++p) {
        float xv = x_dtype == DType::F32 ? test::round_bf16(xf[i * ldx + p])
                                         : bf16_to_f32(xb[i * ldx + p]);
        magnitude += std::abs(xv * bf16_to_f32(w[j * ldw + p]));
      }
      ASSERT_NEAR(y_fast[i * ldy + j], y_ref[i * ldy + j], 1e-5 * magnitude + 1e-30)
          << "m=" << c.m << " n=" << c.n << " k=" << c.k << " at (" << i << "," << j << ")";
    }
    // Padding columns of Y are not ours to write.
    for (int64_t j = c.n; j < ldy; ++j) ASSERT_EQ(y_fast[i * ldy + j], y0[i * ldy + j]);
  }
}

// Sizes that leave partial tiles in every direction: m around the 4-row tile and past the
// 256-row block, n around the 3-column tile and past the 96-row column block (48 for the
// avx512bf16 tiles), k short of a 16-value group, and past the 1024-value depth of one pass
// (2048 for the avx512bf16 tiles, hence 4200 at m = 6); the token lanes' tiles of 4, 3, 2 and 1
// blocks of 16 rows (one part-filled block from m = 10), across their 2048-pair ranges with a lone
// odd value last (65 × 4099); the leftover rows past the last whole block (1 at m = 17 and 33, 8 at
// 24, 12 at 28, 5 at 21 over an odd k, and at m = 260 a second row block of 4 leftover rows and no
// whole block); one part-filled block alone at m = 10 and 12;
// and oneDNN's own blockings.
const Case kAwkwardCases[] = {{1, 33, 96},     {3, 130, 33},   {17, 96, 130},   {100, 33, 130},
                              {1, 1, 1},       {2, 2, 15},     {17, 257, 4100}, {5, 97, 1040},
                              {300, 7, 40},    {4, 3, 16},     {8, 13, 1100},   {9, 7, 517},
                              {24, 12, 3},     {33, 25, 64},   {7, 40, 1030},   {70, 29, 1031},
                              {48, 100, 2049}, {32, 1, 1},     {6, 50, 4200},   {65, 19, 4099},
                              {14, 37, 301},   {17, 13, 4130}, {24, 7, 95},     {21, 11, 4097},
                              {260, 9, 70},    {28, 20, 2111}, {10, 23, 2049},  {12, 97, 130}};

// Every case at every ISA level up to the one in force (scalar, avx2, and oneDNN's at avx512+).
void expect_all_match(DType x_dtype, float beta, int64_t pad) {
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel scoped(level);
    SCOPED_TRACE(isa_name(level));
    for (auto c : kAwkwardCases) expect_matches_reference(c, x_dtype, beta, pad);
  }
}

TEST(CpuGemm, TilesAloneMatchReferenceAtEveryLevel) {
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel scoped(level);
    SCOPED_TRACE(isa_name(level));
    for (auto c : kAwkwardCases) {
      expect_matches_reference(c, DType::F32, 0.0f, 0, Path::kTilesOnly);
      expect_matches_reference(c, DType::BF16, 1.0f, 3, Path::kTilesOnly);
    }
  }
}

TEST(CpuGemm, MatchesReferenceWithF32Activations) {
  expect_all_match(DType::F32, 0.0f, 0);
}

TEST(CpuGemm, MatchesReferenceWithBf16Activations) {
  expect_all_match(DType::BF16, 0.0f, 0);
}

TEST(CpuGemm, AccumulatesWithBetaAndHonoursStrides) {
  expect_all_match(DType::F32, 1.0f, 5);
  expect_all_match(DType::BF16, 0.5f, 3);
}

TEST(CpuGemm, RuntimeRowModeMatchesReference) {
  set_gemm_row_mode(GemmRowMode::kRuntime);
  expect_all_match(DType::F32, 0.0f, 0);
  set_gemm_row_mode(GemmRowMode::kExact);
}

TEST(CpuGemm, OverwritesNonFiniteOutputWhenBetaIsZero) {
  const std::vector<uint16_t> w(3 * 20, f32_to_bf16(1.0f));
  const std::vector<float> x(2 * 20, 1.0f);
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel scoped(level);
    std::vector<float> y(2 * 3, std::nanf(""));
    gemm({.m = 2, .n = 3, .k = 20, .x = x.data(), .w = w.data(), .y = y.data()});
    for (float v : y) EXPECT_EQ(v, 20.0f) << isa_name(level);
  }
}

TEST(CpuGemm, NamesTheImplementationOfEachLevel) {
  const std::vector<uint16_t> w(8 * 8, 0);
  const GemmArgs args{.m = 1, .n = 8, .k = 8, .w = w.data()};
  {
    ScopedIsaLevel scoped(IsaLevel::kScalar);
    EXPECT_EQ(gemm_implementation(args), "sluice:scalar");
  }
  if (isa_level() >= IsaLevel::kAvx2) {
    ScopedIsaLevel scoped(IsaLevel::kAvx2);
    EXPECT_EQ(gemm_implementation(args), "sluice:avx2");
  }
  if (isa_level() >= IsaLevel::kAvx512) {
    // A few rows are bound by reading W, where sluice's tiles are the faster; more go to oneDNN.
    {
      ScopedIsaLevel scoped(IsaLevel::kAvx512);
      EXPECT_EQ(gemm_implementation(args), "sluice:avx2");
    }
    if (isa_level() >= IsaLevel::kAvx512Bf16) {
      ScopedIsaLevel scoped(IsaLevel::kAvx512Bf16);
      EXPECT_EQ(gemm_implementation(args), "sluice:avx512bf16 lanes");  // a block of 4 rows
    }
    GemmArgs wide = args;
    wide.m = 64;
    {
      ScopedIsaLevel scoped(IsaLevel::kAvx512);
      EXPECT_EQ(gemm_implementation(wide).rfind("oneDNN", 0), 0u) << gemm_implementation(wide);
    }
    if (isa_level() >= IsaLevel::kAvx512Bf16 && isa_level() < IsaLevel::kAmx) {
      EXPECT_EQ(gemm_implementation(wide), "sluice:avx512bf16 lanes");
    }
  }
}

TEST(CpuGemm, ZeroRowsIsANoOp) {
  std::vector<uint16_t> w(4 * 8, 0);
  float y = 7.0f;
  gemm({.m = 0, .n = 4, .k = 8, .x = nullptr, .w = w.data(), .y = &y});
  EXPECT_EQ(y, 7.0f);
}

TEST(CpuGemm, RejectsBadShapes) {
  std::vector<uint16_t> w(4 * 8, 0);
  std::vector<float> x(8), y(4);
  EXPECT_THROW(
      gemm({.m = 1, .n = 4, .k = 8, .x = x.data(), .ldx = 4, .w = w.data(), .y = y.data()}), Error);
  EXPECT_THROW(gemm({.m = 1,
                     .n = 4,
                     .k = 8,
                     .x = x.data(),
                     .x_dtype = DType::I32,
                     .w = w.data(),
                     .y = y.data()}),
               Error);
}

}  // namespace
}  // namespace sluice::cpu
