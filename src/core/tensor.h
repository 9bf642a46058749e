// A typed view of weight or activation memory. It may own its bytes (a repacked or synthetic
// tensor) or point into a mapped checkpoint file kept alive by `owner`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sluice {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[8, 4096, 14336]"
int64_t shape_numel(const Shape& s);

struct Tensor {
  DType dtype = DType::F32;
  Shape shape;
  void* data = nullptr;
  std::shared_ptr<void> owner;  // keeps `data` alive: a mapping or an owned buffer
  // F8_E4M3 matrices only: their weight_scale_inv, F32 [⌈rows/128⌉, ⌈cols/128⌉] per matrix and
  // stacked like the values ([E, ...] for experts); the weight is value · scale per block
  // (kernels/cpu/gemm_fp8.h). Null otherwise.
  std::shared_ptr<const Tensor> block_scales;

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Slice `i` along the first dimension: expert i of a stacked [E, ...] tensor (and of its block
  // scales).
  Tensor slice0(int64_t i) const;

  static Tensor allocate(DType dtype, Shape shape);  // zero-filled, 64-byte aligned
  // 64-byte aligned, contents undefined: for a caller that writes every byte itself, so that the
  // pages are first touched (and zeroed by the OS) once, by the threads that fill them.
  static Tensor allocate_for_overwrite(DType dtype, Shape shape);
};

}  // namespace sluice
