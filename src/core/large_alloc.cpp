#include "core/large_alloc.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

namespace sluice {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kHugeFrom = size_t(64) << 20;  // rounding up wastes at most 3%
}  // namespace

void* allocate_large(size_t bytes, size_t align) {
  if (bytes < kHugeFrom)
    return std::aligned_alloc(align, (std::max<size_t>(bytes, 1) + align - 1) / align * align);
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p) ::madvise(p, rounded, MADV_HUGEPAGE);  // advice: refused, the pages stay 4 KiB
  return p;
}

void populate_for_writing(void* p, size_t bytes) {
  if (::madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
  volatile std::byte* b = static_cast<std::byte*>(p);  // kernels before 5.14
  for (size_t i = 0; i < bytes; i += 4096) b[i] = std::byte{0};
}

}  // namespace sluice
