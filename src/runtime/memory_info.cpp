#include "runtime/memory_info.h"

#include <fstream>
#include <string>

namespace sluice {

namespace {
// The value in kB of `key` in a /proc file of "Key:   123 kB" lines, in bytes; 0 if absent.
size_t proc_kb(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  const std::string prefix = key + ":";
  while (std::getline(in, line))
    if (line.compare(0, prefix.size(), prefix) == 0)
      return std::stoull(line.substr(prefix.size())) * 1024;
  return 0;
}
}  // namespace

size_t available_memory_bytes() {
  return proc_kb("/proc/meminfo", "MemAvailable");
}
size_t peak_resident_bytes() {
  return proc_kb("/proc/self/status", "VmHWM");
}
size_t current_resident_bytes() {
  return proc_kb("/proc/self/status", "VmRSS");
}

}  // namespace sluice
