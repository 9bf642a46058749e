#include "kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

TEST(CpuRope, InvFreqFollowsTheFp32Formula) {
  for (int d : {64, 80, 128}) {
    auto inv = rope_inv_freq(d, 1e6f);
    ASSERT_EQ(inv.size(), size_t(d / 2));
    EXPECT_EQ(inv[0], 1.0f);
    // torch rounds the exponent 2i/d to fp32 before the power; that rounding (amplified by
    // ln(theta) ≈ 13.8) is part of the result, so the expectation uses the fp32 exponent too.
    for (int i = 0; i < d / 2; ++i) {
      const double expected = 1.0 / std::pow(1e6, double(float(2 * i) / float(d)));
      EXPECT_NEAR(inv[size_t(i)], expected, 2.5e-7 * expected) << "d=" << d << " i=" << i;
    }
  }
}

TEST(CpuRope, MatchesReferenceOverAwkwardSizes) {
  struct Case {
    int heads, head_dim, rotary_dim;
  };
  // Half widths (rotated pairs per head) of 1, 3, 7, 9, 17, 31 and whole vectors; a partial
  // rotary_dim; 1 row and 7.
  const Case cases[] = {{1, 2, 0},   {3, 64, 0},   {5, 80, 0}, {32, 128, 0}, {2, 128, 64},
                        {4, 34, 0},  {3, 6, 0},    {2, 14, 0}, {7, 18, 0},   {1, 62, 0},
                        {2, 40, 30}, {3, 129, 66}, {1, 16, 2}};
  for (IsaLevel level : isa_levels_up_to_current())
    for (const Case& c : cases)
      for (int64_t rows : {1, 7}) {
        const int64_t stride = int64_t(c.heads) * c.head_dim + 5;
        auto x = test::random_floats(size_t(rows * stride), uint32_t(c.head_dim));
        auto ref = x;
        const int rd = c.rotary_dim ? c.rotary_dim : c.head_dim;
        auto inv_freq = rope_inv_freq(rd, 10000.0f);
        std::vector<int32_t> pos = {131071, 1, 2, 17, 4095, 32767, 0};
        RopeArgs args{.x = x.data(),
                      .rows = rows,
                      .n_heads = c.heads,
                      .head_dim = c.head_dim,
                      .rotary_dim = c.rotary_dim,
                      .row_stride = stride,
                      .positions = pos.data(),
                      .inv_freq = inv_freq.data()};
        {
          ScopedIsaLevel at(level);
          apply_rope(args);
        }
        args.x = ref.data();
        apply_rope_reference(args);
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_NEAR(x[i], ref[i], 1e-6)
              << isa_name(level) << " d=" << c.head_dim << " rotary_dim=" << c.rotary_dim
              << " rows=" << rows << " i=" << i;
      }
}

int64_t float_ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(int64_t(ia) - int64_t(ib));
}

// Rotating (1, 0) pairs gives (cos, sin) exactly on every path, so this compares each level's
// angles with the reference's float(cos(double(angle))): positions up to 2^24 (the last exact
// float), rotary dims whose half is not a multiple of 4.
TEST(CpuRope, AnglesMatchTheDoublePrecisionLibmValues) {
  std::vector<int32_t> pos;
  for (int32_t p = 0; p < 2048; ++p) pos.push_back(p);
  for (int32_t p = 2048; p < (1 << 24); p = p * 9 / 8 + 1) pos.push_back(p);
  pos.push_back(1 << 24);
  for (int rd : {2, 6, 14, 64, 128}) {
    const auto inv_freq = rope_inv_freq(rd, 1e6f);
    const int half = rd / 2;
    std::vector<float> unit(pos.size() * size_t(rd));
    for (size_t r = 0; r < pos.size(); ++r) std::fill_n(unit.begin() + int64_t(r) * rd, half, 1.0f);
    RopeArgs args{.x = nullptr,
                  .rows = int64_t(pos.size()),
                  .n_heads = 1,
                  .head_dim = rd,
                  .positions = pos.data(),
                  .inv_freq = inv_freq.data()};
    std::vector<float> ref = unit;
    args.x = ref.data();
    apply_rope_reference(args);
    for (IsaLevel level : isa_levels_up_to_current()) {
      std::vector<float> x = unit;
      args.x = x.data();
      {
        ScopedIsaLevel at(level);
        apply_rope(args);
      }
      int64_t off_by_one = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const int64_t u = float_ulps(x[i], ref[i]);
        ASSERT_LE(u, 1) << isa_name(level) << " rd=" << rd << " position " << pos[i / size_t(rd)]
                        << " dim " << i % size_t(rd);
        off_by_one += u;
      }
      // Equal but for values within ~1e-16 of a rounding boundary (a sweep of 1.3M positions with
      // rotary_dim 128 found none).
      EXPECT_LE(off_by_one, int64_t(x.size() / 100000)) << isa_name(level) << " rd=" << rd;
    }
  }
}

TEST(CpuRope, RotatesPairsByTheFp32Angle) {
  // One head of dim 4: pairs (0, 2) and (1, 3); check against the formula in double, using the
  // fp32 angle float(pos)·inv_freq as transformers does.
  const int d = 4;
  auto inv_freq = rope_inv_freq(d, 10000.0f);
  for (int32_t pos : {0, 3, 1000, 100000}) {
    std::vector<float> x = {0.5f, -1.25f, 2.0f, 0.75f}, orig = x;
    apply_rope({.x = x.data(),
                .rows = 1,
                .n_heads = 1,
                .head_dim = d,
                .positions = &pos,
                .inv_freq = inv_freq.data()});
    for (int i = 0; i < d / 2; ++i) {
      const double a = double(float(pos) * inv_freq[size_t(i)]);
      EXPECT_NEAR(x[size_t(i)], orig[size_t(i)] * std::cos(a) - orig[size_t(i + 2)] * std::sin(a),
                  1e-6);
      EXPECT_NEAR(x[size_t(i + 2)],
                  orig[size_t(i + 2)] * std::cos(a) + orig[size_t(i)] * std::sin(a), 1e-6);
    }
  }
  // Position 0 is the identity.
  std::vector<float> x = {0.5f, -1.25f, 2.0f, 0.75f}, orig = x;
  int32_t zero = 0;
  apply_rope({.x = x.data(),
              .rows = 1,
              .n_heads = 1,
              .head_dim = d,
              .positions = &zero,
              .inv_freq = inv_freq.data()});
  EXPECT_EQ(x, orig);
}

// DeepSeek's form: adjacent pairs, cos and sin times YaRN's attention factor, on the last
// rotary_dim values of each head (x offset into the head, as MLA's q_pe), at every level.
TEST(CpuRope, InterleavedScaledMatchesTheFormulaAtEveryLevel) {
  struct Case {
    int heads, head_dim, rotary_dim, offset;
  };
  const Case cases[] = {
      {1, 2, 2, 0}, {3, 24, 8, 16}, {16, 192, 64, 128}, {5, 14, 6, 8}, {2, 7, 2, 5}};
  for (IsaLevel level : isa_levels_up_to_current())
    for (const Case& c : cases)
      for (float scale : {1.0f, 1.2079f}) {
        const int64_t rows = 3, stride = int64_t(c.heads) * c.head_dim;
        auto x = test::random_floats(size_t(rows * stride), uint32_t(c.head_dim + c.heads));
        const auto orig = x;
        const auto inv_freq = rope_inv_freq(c.rotary_dim, 10000.0f);
        std::vector<int32_t> pos = {0, 7, 4093};
        RopeArgs args{.x = x.data() + c.offset,
                      .rows = rows,
                      .n_heads = c.heads,
                      .head_dim = c.head_dim,
                      .rotary_dim = c.rotary_dim,
                      .row_stride = stride,
                      .positions = pos.data(),
                      .inv_freq = inv_freq.data(),
                      .interleaved = true,
                      .scale = scale};
        {
          ScopedIsaLevel at(level);
          apply_rope(args);
        }
        for (int64_t r = 0; r < rows; ++r)
          for (int h = 0; h < c.heads; ++h) {
            const size_t base = size_t(r * stride + h * c.head_dim + c.offset);
            for (int d = 0; d < c.head_dim; ++d) {
              if (d + c.offset >= c.head_dim) break;  // the next head's values
              if (d >= c.rotary_dim) {
                ASSERT_EQ(x[base + size_t(d)], orig[base + size_t(d)]);  // outside the rotation
                continue;
              }
              const int i = d / 2;
              const double angle = double(float(pos[size_t(r)]) * inv_freq[size_t(i)]);
              const double cs = std::cos(angle) * scale, sn = std::sin(angle) * scale;
              const double a = orig[base + size_t(2 * i)], b = orig[base + size_t(2 * i + 1)];
              const double want = d % 2 == 0 ? a * cs - b * sn : b * cs + a * sn;
              ASSERT_NEAR(x[base + size_t(d)], want, 2e-6)
                  << isa_name(level) << " heads=" << c.heads << " d=" << d << " row " << r;
            }
            // Values before the offset (q_nope) are untouched.
            for (int d = 0; d < c.offset; ++d)
              ASSERT_EQ(x[size_t(r * stride + h * c.head_dim + d)],
                        orig[size_t(r * stride + h * c.head_dim + d)]);
          }
      }
}

TEST(CpuRope, RejectsOddRotaryDim) {
  float x[4] = {};
  int32_t pos = 0;
  float inv = 1;
  EXPECT_THROW(apply_rope({.x = x,
                           .rows = 1,
                           .n_heads = 1,
                           .head_dim = 4,
                           .rotary_dim = 3,
                           .positions = &pos,
                           .inv_freq = &inv}),
               Error);
}

}  // namespace
}  // namespace sluice::cpu
