#include "kernels/cpu/isa.h"

#include <atomic>

namespace sluice::cpu {
namespace {
std::atomic<bool> g_force_scalar{false};
}

bool has_avx512() {
  static const bool supported = __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
  return supported && !g_force_scalar.load(std::memory_order_relaxed);
}

bool has_avx512_bf16() {
  static const bool supported = __builtin_cpu_supports("avx512bf16");
  return supported && has_avx512();
}

void force_scalar_kernels(bool on) {
  g_force_scalar.store(on, std::memory_order_relaxed);
}

}  // namespace sluice::cpu
