#include "core/tensor.h"

#include <fmt/format.h>

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

// A tensor's allocation: its bytes rounded up to whole 64-byte lines (allocate zeroes them all,
// the padding included).
size_t allocated_bytes(const Tensor& t) {
  return (t.nbytes() + 63) / 64 * 64;
}

}  // namespace

Tensor Tensor::allocate_for_overwrite(DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t bytes = allocated_bytes(t);
  void* p = allocate_large(bytes, 64);
  if (!p)
    fail("out of memory allocating {} bytes for a tensor of shape {}", bytes, shape_str(t.shape));
  t.data = p;
  t.owner = std::shared_ptr<void>(p, std::free);
  return t;
}

Tensor Tensor::allocate(DType dtype, Shape shape) {
  Tensor t = allocate_for_overwrite(dtype, std::move(shape));
  std::memset(t.data, 0, allocated_bytes(t));
  return t;
}

}  // namespace sluice
