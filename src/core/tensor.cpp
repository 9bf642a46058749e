#include "core/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/large_alloc.h"

namespace sluice {

std::string shape_str(const Shape& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor Tensor::slice0(int64_t i) const {
  if (shape.empty() || i < 0 || i >= shape[0])
    fail("slice {} out of range for tensor of shape {}", i, shape_str(shape));
  Tensor t = *this;
  t.shape.erase(t.shape.begin());
  t.data = static_cast<char*>(data) + size_t(i) * t.nbytes();
  if (block_scales) t.block_scales = std::make_shared<const Tensor>(block_scales->slice0(i));
  return t;
}

namespace {

template <typename T>
void transpose_tiles(const T* src, T* dst, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
    }
}

struct Bytes8 {
  std::byte b[8];
};

}  // namespace

void transpose_matrix(const void* src, void* dst, int64_t rows, int64_t cols,
                      size_t element_bytes) {
  switch (element_bytes) {
    case 1:
      return transpose_tiles(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), rows,
                             cols);
    case 2:
      return transpose_tiles(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), rows,
                             cols);
    case 4:
      return transpose_tiles(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), rows,
                             cols);
    case 8:
      return transpose_tiles(static_cast<const Bytes8*>(src), static_cast<Bytes8*>(dst), rows,
                             cols);
    default:
      fail("transpose_matrix: elements of {} bytes (expected 1, 2, 4 or 8)", element_bytes);
  }
}

Tensor Tensor::allocate(DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  size_t bytes = (t.nbytes() + 63) / 64 * 64;
  void* p = allocate_large(bytes, 64);
  if (!p)
    fail("out of memory allocating {} bytes for a tensor of shape {}", bytes, shape_str(t.shape));
  std::memset(p, 0, bytes);
  t.data = p;
  t.owner = std::shared_ptr<void>(p, std::free);
  return t;
}

}  // namespace sluice
