// Memory for large buffers: weights copied or repacked at load, the disk tier's page pool, KV
// caches.
#pragma once

#include <cstddef>

namespace sluice {

// `bytes` aligned to `align` (a power of two up to 2 MiB), freed with std::free; null when out
// of memory. From 64 MiB up (where rounding to whole huge pages adds at most 3%) the buffer is
// 2 MiB-aligned and the kernel is asked for transparent huge pages (MADV_HUGEPAGE; in the default
// THP mode, "madvise", only those who ask get them): a first touch then faults 2 MiB at a time.
// On the development VM a first touch of 1 GiB took 0.10 s in huge pages against 0.45 s in 4 KiB
// ones: time the disk tier's loader, and a load's copies, otherwise spend before each first read
// or copy lands.
void* allocate_large(size_t bytes, size_t align = 64);

// Makes [p, p + bytes) resident, as a write to each page would.
void populate_for_writing(void* p, size_t bytes);

}  // namespace sluice
