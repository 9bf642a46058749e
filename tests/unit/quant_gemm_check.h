// The bitwise check that the int8 and int4 GEMM tests share: every ISA level and every int8
// instruction gives exactly the scalar reference's bits (gemm_int8.h's arithmetic contract).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/gemm_int8.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu::test_quant {

// Bitwise equality of two fp32 arrays (NaN-safe, -0 distinct from +0).
inline void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b,
                             const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    ASSERT_EQ(x, y) << what << " at " << i << ": " << a[i] << " vs " << b[i];
  }
}

struct Shape {
  int64_t m, n, k, group;
};

inline std::string describe(const Shape& s) {
  return "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
         " group=" + std::to_string(s.group);
}

// m: one row, a partial 4-row tile, several tiles, and more than one 128-row pass over W.
// n: one column, a partial 16-column block, three blocks, and seven (a tile of four blocks, then
// one of three with the last partial). k: one group, several, a group of the format's smallest
// size, and a k that spans two sweeps with the second one partial. One group of X is all zeros
// (scale 0); beta 0 and not.
inline void expect_every_level_matches_the_reference(QuantFormat format, int64_t smallest_group) {
  std::vector<Shape> shapes;
  for (int64_t m : {1, 3, 17, 65})
    for (int64_t n : {1, 7, 33, 100})
      for (auto [k, group] : {std::pair<int64_t, int64_t>{32, 32}, {96, 32}, {256, 128},
                              {3 * smallest_group, smallest_group}})
        shapes.push_back({m, n, k, group});
  shapes.push_back({130, 18, 64, 32});
  shapes.push_back({5, 17, 1088, 32});
  // Sweeps of many small groups: more than a fused 4 × 4 tile takes in one call.
  shapes.push_back({9, 64, 40 * smallest_group, smallest_group});
  for (const Shape& s : shapes) {
    const auto seed = uint32_t(s.m * 1000 + s.n * 10 + s.k);
    const auto w = quantize_weights(format, test::random_bf16(size_t(s.n * s.k), seed).data(), s.n,
                                    s.k, s.group);
    auto x = test::random_floats(size_t(s.m * s.k), seed + 1, 2.0f);
    std::fill(x.begin(), x.begin() + s.group, 0.0f);
    const auto y0 = test::random_floats(size_t(s.m * s.n), seed + 2);
    for (float beta : {0.0f, 0.75f}) {
      const GemmInt8Args args{.m = s.m, .x = x.data(), .w = &w, .beta = beta};
      std::vector<float> ref = y0;
      GemmInt8Args ref_args = args;
      ref_args.y = ref.data();
      gemm_int8_reference(ref_args);
      const std::string what = std::string(quant_format_name(format)) + " " + describe(s) +
                               " beta=" + std::to_string(beta);
      for (IsaLevel level : isa_levels_up_to_current()) {
        ScopedIsaLevel at(level);
        std::vector<float> y = y0;
        GemmInt8Args a = args;
        a.y = y.data();
        gemm_int8(a);
        expect_same_bits(
            y, ref,
            what + " level " + isa_name(level) + " (" + int8_dot_name(gemm_int8_dot()) + ")");
        for (Int8Dot dot : gemm_int8_dots_available()) {
          y = y0;
          gemm_int8_using(dot, a);
          expect_same_bits(y, ref, what + " " + int8_dot_name(dot));
        }
      }
    }
  }
}

}  // namespace sluice::cpu::test_quant
