#include "kernels/cpu/gemm_fp8.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

// Codes over the whole e4m3 range (normals, subnormals, zeros of both signs; NaN left out, it
// has its own test) and block scales of varied magnitude.
struct Fp8Case {
  std::vector<uint8_t> q;
  std::vector<float> scale;
  Fp8Matrix w;

  Fp8Case(int64_t n, int64_t k, uint32_t seed) {
    std::mt19937 rng(seed);
    q.resize(size_t(n * k));
    for (auto& c : q) {
      c = uint8_t(rng());
      if ((c & 0x7f) == 0x7f) c &= 0xfe;
    }
    w = {nullptr, nullptr, n, k};
    scale.resize(size_t(w.scale_rows() * w.scale_cols()));
    std::uniform_real_distribution<float> exponent(-12.f, 2.f);
    for (auto& s : scale) s = std::exp2(exponent(rng));
    w.q = q.data();
    w.scale = scale.data();
  }
};

TEST(Fp8Codes, WidenExactlyAndRoundToNearestEven) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);                  // exponent 7, mantissa 0
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);                // the largest finite
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
  // Every code except NaN survives the round trip.
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) != 0x7f) {
      EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(uint8_t(c))), c) << c;
    }
  }
  EXPECT_EQ(f32_to_fp8_e4m3(1.0625f), 0x38);  // halfway between 1 and 1.125: to the even 1
  EXPECT_EQ(f32_to_fp8_e4m3(1.1875f), 0x3a);  // halfway between 1.125 and 1.25: to 1.25
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), 0x7e);   // the tie with NaN rounds to 448
  EXPECT_EQ(f32_to_fp8_e4m3(465.0f), 0x7f);   // past it: NaN (no infinity)
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: even
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
}

// Every level's dequantisation is the scalar one bit for bit, over partial blocks both ways and
// over runs that start inside a block.
TEST(CpuGemmFp8, DequantisesLikeTheScalarFormAtEveryLevel) {
  const Fp8Case c(200, 300, 7);  // blocks: 128 + 72 rows, 128 + 128 + 44 columns
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel scoped(level);
    SCOPED_TRACE(isa_name(level));
    // {first row, rows, first column, columns}
    const std::array<std::array<int64_t, 4>, 4> ranges = {
        {{0, 200, 0, 300}, {100, 57, 120, 17}, {127, 3, 250, 50}, {5, 1, 3, 1}}};
    for (const auto& [r0, rows, c0, cols] : ranges) {
      std::vector<uint16_t> fast(size_t(rows * cols)), ref(fast.size());
      dequantize_fp8(c.w, r0, rows, c0, cols, fast.data(), cols);
      dequantize_fp8_scalar(c.w, r0, rows, c0, cols, ref.data(), cols);
      ASSERT_EQ(fast, ref) << r0 << " " << rows << " " << c0 << " " << cols;
    }
  }
  // And the scalar form is bf16(code · scale of the block).
  std::vector<uint16_t> all(size_t(200 * 300));
  dequantize_fp8_scalar(c.w, 0, 200, 0, 300, all.data(), 300);
  for (int64_t j : {0, 127, 128, 199})
    for (int64_t p : {0, 127, 128, 255, 256, 299})
      EXPECT_EQ(all[size_t(j * 300 + p)], f32_to_bf16(fp8_e4m3_to_f32(c.q[size_t(j * 300 + p)]) *
                                                      c.scale[size_t((j / 128) * 3 + p / 128)]));
}

TEST(CpuGemmFp8, NanCodesStayNan) {
  std::vector<uint8_t> q = {0x7f, 0xff, 0x38};
  const float scale = 0.5f;
  const Fp8Matrix w{q.data(), &scale, 1, 3};
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel scoped(level);
    uint16_t out[3];
    dequantize_fp8(w, 0, 1, 0, 3, out, 3);
    EXPECT_TRUE(std::isnan(bf16_to_f32(out[0])));
    EXPECT_TRUE(std::isnan(bf16_to_f32(out[1])));
    EXPECT_EQ(bf16_to_f32(out[2]), 0.5f);
  }
}

struct Shape3 {
  int64_t m, n, k;
};

// Against the reference (whole W dequantised, then the plain bf16 GEMM): both multiply the same
// bf16 values, so they differ only in the order of the fp32 additions; the bound is relative to
// Σ|x·w| as in gemm_test.cpp.
void expect_matches_reference(const Shape3& s, DType x_dtype, float beta) {
  const Fp8Case c(s.n, s.k, uint32_t(s.n * 31 + s.k));
  const int64_t ldx = s.k + 3, ldy = s.n + 2;
  auto xf = test::random_floats(size_t(s.m * ldx), 11 + uint32_t(s.m));
  auto xb = test::random_bf16(size_t(s.m * ldx), 12 + uint32_t(s.m));
  auto y0 = test::random_floats(size_t(s.m * ldy), 13);
  auto y_fast = y0, y_ref = y0;
  GemmFp8Args a{.m = s.m,
                .x = x_dtype == DType::F32 ? static_cast<const void*>(xf.data()) : xb.data(),
                .x_dtype = x_dtype,
                .ldx = ldx,
                .w = &c.w,
                .y = y_fast.data(),
                .ldy = ldy,
                .beta = beta};
  gemm_fp8(a);
  a.y = y_ref.data();
  gemm_fp8_reference(a);
  std::vector<uint16_t> w(size_t(s.n * s.k));
  dequantize_fp8_scalar(c.w, 0, s.n, 0, s.k, w.data(), s.k);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double magnitude = std::abs(beta * y0[size_t(i * ldy + j)]);
      for (int64_t p = 0; p < s.k; ++p) {
        const float xv = x_dtype == DType::F32 ? test::round_bf16(xf[size_t(i * ldx + p)])
                                               : bf16_to_f32(xb[size_t(i * ldx + p)]);
        magnitude += std::abs(xv * bf16_to_f32(w[size_t(j * s.k + p)]));
      }
      ASSERT_NEAR(y_fast[size_t(i * ldy + j)], y_ref[size_t(i * ldy + j)], 1e-5 * magnitude + 1e-30)
          << "m=" << s.m << " n=" << s.n << " k=" << s.k << " at (" << i << "," << j << ")";
    }
    for (int64_t j = s.n; j < ldy; ++j)
      ASSERT_EQ(y_fast[size_t(i * ldy + j)], y0[size_t(i * ldy + j)]);
  }
}

// Partial scale blocks both ways (576 rows as kv_a_proj_with_mqa, k short of and past one
// 1024-value panel depth, a single row or column), and m across the tiles' 4-row tile, the
// token-lane kernel and the 256-row block.
const Shape3 kCases[] = {{1, 576, 200}, {3, 130, 1100}, {5, 64, 128},  {17, 1, 129},
                         {1, 7, 2100},  {40, 200, 300}, {300, 65, 40}, {2, 129, 1}};

TEST(CpuGemmFp8, MatchesReferenceAtEveryLevel) {
  for (IsaLevel level : isa_levels_up_to_current()) {
    ScopedIsaLevel scoped(level);
    SCOPED_TRACE(isa_name(level));
    for (const Shape3& s : kCases) {
      expect_matches_reference(s, DType::F32, 0.0f);
      expect_matches_reference(s, DType::BF16, 0.5f);
    }
  }
}

TEST(CpuGemmFp8, RejectsMissingScales) {
  std::vector<uint8_t> q(4);
  const Fp8Matrix w{q.data(), nullptr, 2, 2};
  float y[4], x[4] = {};
  EXPECT_THROW(gemm_fp8({.m = 2, .x = x, .w = &w, .y = y}), Error);
}

}  // namespace
}  // namespace sluice::cpu
