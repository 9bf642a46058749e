// What the operating system says about memory: for KV budgets and the peak-memory report.
#pragma once

#include <cstddef>

namespace sluice {

size_t available_memory_bytes();  // MemAvailable from /proc/meminfo
size_t peak_resident_bytes();     // VmHWM of this process
size_t current_resident_bytes();  // VmRSS of this process

}  // namespace sluice
