// transpose_matrix (core/tensor.h) against the definition, element by element, at sizes that are
// not multiples of its tiles and for every element width it takes.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "test_util.h"

namespace sluice {
namespace {

TEST(TransposeMatrix, EqualsTheDefinitionAtAwkwardSizes) {
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1},   {1, 37},   {37, 1}, {31, 33},
                                               {64, 96}, {65, 130}, {100, 7}};
  for (const size_t width : {1u, 2u, 4u, 8u})
    for (const auto& [rows, cols] : sizes) {
      std::vector<unsigned char> src(size_t(rows * cols) * width), got(src.size());
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
      transpose_matrix(src.data(), got.data(), rows, cols, width);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(std::memcmp(got.data() + size_t(c * rows + r) * width,
                                src.data() + size_t(r * cols + c) * width, width),
                    0)
              << rows << " x " << cols << " of " << width << "-byte elements, at " << r << ", "
              << c;
    }
}

TEST(TransposeMatrix, AnElementWidthItDoesNotTakeIsNamed) {
  unsigned char a[3] = {}, b[3] = {};
  EXPECT_ERROR_MENTIONS(transpose_matrix(a, b, 1, 1, 3), "3 bytes");
}

}  // namespace
}  // namespace sluice
