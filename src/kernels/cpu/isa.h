// Which vector instruction sets the running CPU offers. The build targets x86-64-v2 so the binary
// runs anywhere; AVX-512 kernels are compiled per function with target attributes and chosen here
// at run time, falling back to the scalar reference.
#pragma once

namespace sluice::cpu {

// AVX-512 F/BW/VL with FMA: the baseline of every fast path in src/kernels/cpu.
bool has_avx512();
// AVX512-BF16 (vcvtne2ps2bf16, vdpbf16ps) on top of has_avx512().
bool has_avx512_bf16();

// Tests and benchmarks force the scalar path to compare it with the vector one.
// Not thread-safe against concurrent kernel calls: set it before running kernels.
void force_scalar_kernels(bool on);

}  // namespace sluice::cpu

// Attribute for functions that use AVX-512 intrinsics inside an x86-64-v2 build.
#define SLUICE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define SLUICE_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
