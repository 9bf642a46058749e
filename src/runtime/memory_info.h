// What the operating system says about memory: for the host-memory budget, KV budgets and the
// peak-memory report.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace sluice {

size_t available_memory_bytes();  // MemAvailable from /proc/meminfo
size_t peak_resident_bytes();     // VmHWM of this process
// Starts VmHWM again from the resident set now (/proc/self/clear_refs); false where the kernel
// does not allow it.
bool reset_peak_resident();
size_t current_resident_bytes();  // VmRSS of this process
// The bytes this process had read from storage, page-cache hits not counted (read_bytes of
// /proc/self/io: reads, O_DIRECT reads, and the readahead of faults on mapped files); nullopt
// where the kernel does not account them.
std::optional<size_t> storage_read_bytes();

// What this process may still allocate before the kernel refuses or kills it: MemAvailable,
// capped by the room left under each memory cgroup limit this process is in (v2 memory.max less
// memory.current, v1 memory.limit_in_bytes less memory.usage_in_bytes, for its cgroup and every
// ancestor) and under its address-space limit (RLIMIT_AS, `ulimit -v`, less VmSize).
struct AllocatableMemory {
  size_t bytes = 0;
  std::string limited_by;  // "MemAvailable", "cgroup memory.max", "ulimit -v", ...
};
AllocatableMemory allocatable_memory();
// The same from a MemAvailable figure read once (it moves with the other processes).
AllocatableMemory allocatable_memory(size_t mem_available);

// The room under one cgroup's limit from its files' contents ("max" or a number of bytes);
// nullopt when unlimited or unreadable.
std::optional<size_t> cgroup_room(const std::string& limit, const std::string& usage);

}  // namespace sluice
