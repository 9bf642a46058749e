// The instruction-set level the CPU kernels run at: detected once (cpuid, plus xgetbv for the
// register state the OS enables), lowered by SLUICE_ISA=<level> or by a test, and used by every
// dispatching kernel. The build targets x86-64-v2, so the binary runs anywhere; the vector
// kernels are compiled per function with the target attributes below and chosen at run time.
//
//   scalar      the x86-64-v2 baseline (SSE4.2): plain C++ the compiler may auto-vectorise
//   avx2        AVX2 + FMA + F16C, 256-bit: fp32 FMA; int8 through vpmaddubsw (or AVX-VNNI)
//   avx512      AVX-512 F/BW/VL/DQ, 512-bit: fp32 FMA; int8 through AVX512-VNNI where present
//   avx512bf16  avx512 + AVX512-BF16 (vdpbf16ps, vcvtne2ps2bf16)
//   amx         avx512bf16 + AMX-TILE/BF16/INT8, with the OS permission asked through arch_prctl
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::cpu {

enum class IsaLevel : uint8_t { kScalar, kAvx2, kAvx512, kAvx512Bf16, kAmx };

const char* isa_name(IsaLevel level);
std::optional<IsaLevel> parse_isa(std::string_view name);

// Instruction-set extensions that do not define a level of their own but that kernels of a
// level may use when present (the int8 dot products), as cpuid and the OS report them.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512 = false;       // F, BW, VL, DQ, with the OS saving ZMM and mask state
  bool avx512_bf16 = false;  // AVX512-BF16
  bool avx512_vnni = false;  // vpdpbusd on 512-bit (and 128/256 with VL)
  bool avx_vnni = false;     // the VEX-encoded vpdpbusd of 256-bit machines
  bool amx = false;          // AMX-TILE, AMX-BF16 and AMX-INT8, with tile data permitted
};

// What this CPU and OS offer, detected once.
const CpuFeatures& cpu_features();
// The CPU's own brand string ("AMD EPYC 9B45", "Intel(R) Xeon(R) Platinum 8480+").
const std::string& cpu_model_name();
// The highest level this CPU offers, and every level from scalar up to it.
IsaLevel cpu_isa_level();
std::vector<IsaLevel> supported_isa_levels();
// Every level from scalar up to the one in force (isa_level()): what the tests loop over, so that
// a run under SLUICE_ISA=avx2 proves the avx2 and scalar paths and nothing above them.
std::vector<IsaLevel> isa_levels_up_to_current();

// The level the kernels use now: the CPU's own, or lower when SLUICE_ISA or set_isa_level says
// so. The first call reads SLUICE_ISA and fails (sluice::Error) on an unknown name or a level
// above the CPU's, with a message that lists the levels this CPU offers.
IsaLevel isa_level();
inline bool isa_at_least(IsaLevel level) {
  return isa_level() >= level;
}
// Validates SLUICE_ISA now (the CLI calls it first, so a bad value is one clear error).
void check_isa_environment();
// Forces the level, for tests and benchmarks comparing kernels; fails above the CPU's level.
// Not thread-safe against concurrent kernel calls: set it before running kernels.
void set_isa_level(IsaLevel level);

// The int8 dot-product instruction the int8 kernels of the current level use.
enum class Int8Dot : uint8_t { kScalar, kAvx2Maddubs, kAvxVnni, kAvx512Vnni, kAmx };
const char* int8_dot_name(Int8Dot dot);
Int8Dot int8_dot();

// Sets the level for the lifetime of a scope, restoring the previous one after.
class ScopedIsaLevel {
 public:
  explicit ScopedIsaLevel(IsaLevel level) : previous_(isa_level()) { set_isa_level(level); }
  ~ScopedIsaLevel() { set_isa_level(previous_); }
  ScopedIsaLevel(const ScopedIsaLevel&) = delete;
  ScopedIsaLevel& operator=(const ScopedIsaLevel&) = delete;

 private:
  IsaLevel previous_;
};

}  // namespace sluice::cpu

// Attributes for functions that use vector intrinsics inside an x86-64-v2 build.
#define SLUICE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SLUICE_AVX2_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define SLUICE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define SLUICE_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))
#define SLUICE_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#define SLUICE_AMX                                                                        \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,amx-tile,amx-bf16," \
                        "amx-int8")))
