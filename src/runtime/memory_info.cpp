#include "runtime/memory_info.h"

#include <sys/resource.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <string>

namespace sluice {

namespace {
// The number after `key` in a /proc file of "Key:   123[ kB]" lines; nullopt if absent.
std::optional<size_t> proc_number(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  const std::string prefix = key + ":";
  while (std::getline(in, line))
    if (line.compare(0, prefix.size(), prefix) == 0) return std::stoull(line.substr(prefix.size()));
  return std::nullopt;
}

// The value in kB of `key` in a /proc file of "Key:   123 kB" lines, in bytes; 0 if absent.
size_t proc_kb(const char* file, const std::string& key) {
  return proc_number(file, key).value_or(0) * 1024;
}

std::string first_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

void cap(AllocatableMemory& m, std::optional<size_t> room, const std::string& by) {
  if (room && *room < m.bytes) m = {*room, by};
}

// Every memory cgroup of this process, from /proc/self/cgroup ("0::/path" for v2,
// "N:memory:/path" for v1), checked from its own folder up to the root of the hierarchy.
void cap_by_cgroups(AllocatableMemory& m) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const bool v2 = controllers.empty();
    if (!v2 && controllers.find("memory") == std::string::npos) continue;
    const std::filesystem::path root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    std::filesystem::path dir = root / std::filesystem::path(line.substr(b + 1)).relative_path();
    for (;;) {
      const auto limit = first_line(dir / (v2 ? "memory.max" : "memory.limit_in_bytes"));
      const auto usage = first_line(dir / (v2 ? "memory.current" : "memory.usage_in_bytes"));
      cap(m, cgroup_room(limit, usage),
          "cgroup " + (dir / (v2 ? "memory.max" : "memory.limit_in_bytes")).string());
      if (dir == root || !dir.has_parent_path() || dir.parent_path() == dir) break;
      dir = dir.parent_path();
    }
  }
}
}  // namespace

size_t available_memory_bytes() {
  return proc_kb("/proc/meminfo", "MemAvailable");
}
size_t peak_resident_bytes() {
  return proc_kb("/proc/self/status", "VmHWM");
}
bool reset_peak_resident() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}
size_t current_resident_bytes() {
  return proc_kb("/proc/self/status", "VmRSS");
}
std::optional<size_t> storage_read_bytes() {
  return proc_number("/proc/self/io", "read_bytes");
}

std::optional<size_t> cgroup_room(const std::string& limit, const std::string& usage) {
  size_t l = 0, u = 0;
  auto parse = [](const std::string& s, size_t& v) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && end != s.data();
  };
  if (!parse(limit, l) || !parse(usage, u)) return std::nullopt;  // "max", or no such file
  return l > u ? l - u : 0;
}

AllocatableMemory allocatable_memory() {
  return allocatable_memory(available_memory_bytes());
}

AllocatableMemory allocatable_memory(size_t mem_available) {
  AllocatableMemory m{mem_available, "MemAvailable"};
  cap_by_cgroups(m);
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const size_t used = proc_kb("/proc/self/status", "VmSize");
    cap(m, as.rlim_cur > used ? size_t(as.rlim_cur) - used : 0, "ulimit -v");
  }
  return m;
}

}  // namespace sluice
