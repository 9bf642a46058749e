// cpu::transpose_matrix (kernels/cpu/transpose.h) against the definition, at sizes that are not
// multiples of its 8 × 8 blocks or its tiles, and for every element width it takes.
#include "kernels/cpu/transpose.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace sluice {
namespace {

TEST(TransposeMatrix, EqualsTheReferenceAtAwkwardSizes) {
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1},   {1, 37},    {37, 1},   {7, 9},
                                               {8, 8},   {31, 33},   {64, 96},  {65, 130},
                                               {100, 7}, {136, 264}, {257, 129}};
  for (const size_t width : {1u, 2u, 4u, 8u})
    for (const auto& [rows, cols] : sizes) {
      std::vector<unsigned char> src(size_t(rows * cols) * width), got(src.size()),
          want(src.size());
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
      cpu::transpose_matrix(src.data(), got.data(), rows, cols, width);
      cpu::transpose_matrix_reference(src.data(), want.data(), rows, cols, width);
      EXPECT_EQ(got, want) << rows << " x " << cols << " of " << width << "-byte elements";
    }
}

// The reference is the definition: element (r, c) lands at (c, r).
TEST(TransposeMatrix, TheReferenceMovesEachElementToItsMirror) {
  const std::vector<uint16_t> src = {1, 2, 3, 4, 5, 6};  // 2 x 3
  std::vector<uint16_t> dst(6);
  cpu::transpose_matrix_reference(src.data(), dst.data(), 2, 3, 2);
  EXPECT_EQ(dst, (std::vector<uint16_t>{1, 4, 2, 5, 3, 6}));
}

TEST(TransposeMatrix, AnElementWidthItDoesNotTakeIsNamed) {
  unsigned char a[3] = {}, b[3] = {};
  EXPECT_ERROR_MENTIONS(cpu::transpose_matrix(a, b, 1, 1, 3), "3 bytes");
}

}  // namespace
}  // namespace sluice
