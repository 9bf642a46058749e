#include "kernels/cpu/isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace sluice::cpu {
namespace {

constexpr std::array<std::string_view, 5> kNames = {"scalar", "avx2", "avx512", "avx512bf16",
                                                    "amx"};

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) return {};
  return r;
}

bool bit(unsigned reg, int n) {
  return (reg >> n) & 1u;
}

// XCR0: which register states the OS saves on a context switch. Read with xgetbv, which is
// only allowed when the OS has set CR4.OSXSAVE (cpuid 1 ECX bit 27).
uint64_t os_enabled_state() {
  if (!bit(cpuid(1).c, 27)) return 0;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux keeps AMX tile data off until a process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM
// for XFEATURE_XTILEDATA); without the permission the first tile instruction faults.
bool request_amx_permission() {
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures detect() {
  CpuFeatures f;
  const Regs l1 = cpuid(1);
  const unsigned max_leaf = cpuid(0).a;
  const Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const Regs l71 = max_leaf >= 7 && l7.a >= 1 ? cpuid(7, 1) : Regs{};
  const uint64_t xcr0 = os_enabled_state();
  const bool os_avx = (xcr0 & 0x6) == 0x6;             // SSE and AVX (YMM) state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;      // XTILECFG and XTILEDATA
  const bool avx = bit(l1.c, 28) && os_avx;
  f.fma = avx && bit(l1.c, 12);
  f.f16c = avx && bit(l1.c, 29);
  f.avx2 = avx && bit(l7.b, 5);
  f.avx_vnni = f.avx2 && bit(l71.a, 4);
  f.avx512 = os_avx512 && bit(l7.b, 16) && bit(l7.b, 17) && bit(l7.b, 30) && bit(l7.b, 31);
  f.avx512_vnni = f.avx512 && bit(l7.c, 11);
  f.avx512_bf16 = f.avx512 && bit(l71.a, 5);
  const bool amx_cpu = bit(l7.d, 22) && bit(l7.d, 24) && bit(l7.d, 25);
  f.amx = f.avx512_bf16 && amx_cpu && os_amx && request_amx_permission();
  return f;
}

IsaLevel level_of(const CpuFeatures& f) {
  if (f.amx) return IsaLevel::kAmx;
  if (f.avx512_bf16) return IsaLevel::kAvx512Bf16;
  if (f.avx512 && f.fma) return IsaLevel::kAvx512;
  if (f.avx2 && f.fma && f.f16c) return IsaLevel::kAvx2;
  return IsaLevel::kScalar;
}

std::string offered_levels() {
  std::string names;
  for (IsaLevel l : supported_isa_levels()) names += std::string(names.empty() ? "" : ", ") + isa_name(l);
  return names;
}

IsaLevel level_from_environment() {
  const char* env = std::getenv("SLUICE_ISA");
  if (env == nullptr || *env == '\0') return cpu_isa_level();
  const auto level = parse_isa(env);
  if (!level)
    fail("SLUICE_ISA={}: expected one of scalar, avx2, avx512, avx512bf16, amx; this CPU ({}) "
         "offers {}",
         env, cpu_model_name(), offered_levels());
  if (*level > cpu_isa_level())
    fail("SLUICE_ISA={}: this CPU ({}) does not offer that level; it offers {}", env,
         cpu_model_name(), offered_levels());
  return *level;
}

std::atomic<int> g_level{-1};
std::mutex g_init_mutex;

}  // namespace

const char* isa_name(IsaLevel level) {
  return kNames[size_t(level)].data();
}

std::optional<IsaLevel> parse_isa(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return IsaLevel(i);
  return std::nullopt;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

const std::string& cpu_model_name() {
  static const std::string name = [] {
    if (cpuid(0x80000000).a < 0x80000004) return std::string("unknown x86-64 CPU");
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    std::string s(brand);
    const size_t first = s.find_first_not_of(' '), last = s.find_last_not_of(' ');
    return first == std::string::npos ? std::string("unknown x86-64 CPU")
                                      : s.substr(first, last - first + 1);
  }();
  return name;
}

IsaLevel cpu_isa_level() {
  static const IsaLevel level = level_of(cpu_features());
  return level;
}

std::vector<IsaLevel> supported_isa_levels() {
  std::vector<IsaLevel> levels;
  for (int l = 0; l <= int(cpu_isa_level()); ++l) levels.push_back(IsaLevel(l));
  return levels;
}

std::vector<IsaLevel> isa_levels_up_to_current() {
  std::vector<IsaLevel> levels = supported_isa_levels();
  levels.resize(size_t(isa_level()) + 1);
  return levels;
}

IsaLevel isa_level() {
  const int cached = g_level.load(std::memory_order_relaxed);
  if (cached >= 0) return IsaLevel(cached);
  std::lock_guard lock(g_init_mutex);
  if (g_level.load() < 0) g_level.store(int(level_from_environment()));
  return IsaLevel(g_level.load());
}

void check_isa_environment() {
  (void)isa_level();
}

void set_isa_level(IsaLevel level) {
  if (level > cpu_isa_level())
    fail("isa level {}: this CPU ({}) does not offer it; it offers {}", isa_name(level),
         cpu_model_name(), offered_levels());
  g_level.store(int(level), std::memory_order_relaxed);
}

const char* int8_dot_name(Int8Dot dot) {
  switch (dot) {
    case Int8Dot::kScalar: return "scalar";
    case Int8Dot::kAvx2Maddubs: return "avx2 vpmaddubsw";
    case Int8Dot::kAvxVnni: return "avx-vnni vpdpbusd";
    case Int8Dot::kAvx512Vnni: return "avx512-vnni vpdpbusd";
    case Int8Dot::kAmx: return "amx-int8 tdpbusd";
  }
  return "?";
}

Int8Dot int8_dot() {
  const CpuFeatures& f = cpu_features();
  switch (isa_level()) {
    case IsaLevel::kScalar: return Int8Dot::kScalar;
    case IsaLevel::kAvx2: return f.avx_vnni ? Int8Dot::kAvxVnni : Int8Dot::kAvx2Maddubs;
    case IsaLevel::kAvx512:
    case IsaLevel::kAvx512Bf16:
      if (f.avx512_vnni) return Int8Dot::kAvx512Vnni;
      return f.avx_vnni ? Int8Dot::kAvxVnni : Int8Dot::kAvx2Maddubs;
    case IsaLevel::kAmx: return Int8Dot::kAmx;
  }
  return Int8Dot::kScalar;
}

}  // namespace sluice::cpu
