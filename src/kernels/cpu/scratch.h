// Per-thread scratch buffers for the GEMM kernels: grown as needed, kept for the next call.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace sluice::cpu {

// A buffer of at least `count` T for the calling thread, 64-byte aligned, one per Slot (a kernel
// that needs two buffers at once names two slots). Its contents are not kept when it grows.
template <int Slot, typename T>
T* thread_scratch(size_t count) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<T, Free> buffer;
  thread_local size_t capacity = 0;
  if (capacity < count) {
    const size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    capacity = 0;
    buffer.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!buffer) fail("gemm: could not allocate {} bytes of scratch", bytes);
    capacity = count;
  }
  return buffer.get();
}

}  // namespace sluice::cpu
