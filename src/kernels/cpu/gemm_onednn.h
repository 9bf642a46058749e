// cpu::gemm through oneDNN's bf16 matmul: used at the AVX-512 levels, where oneDNN 2.6 has a bf16
// implementation (native with AVX512-BF16 or AMX, emulated on plain AVX-512). Below AVX-512 it
// has none, and creating a primitive fails; that failure is remembered per shape and reported as
// `false`, so the caller falls back to sluice's own kernel instead of ending the run.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/cpu/gemm.h"

namespace sluice::cpu::onednn {

// Runs Y = X·Wᵀ + beta·Y for resolved arguments (every stride set); false when oneDNN has no
// primitive for them on this CPU.
bool try_gemm(const GemmArgs& resolved, bool runtime_rows);

// oneDNN's name for the implementation it picks ("brg:avx512_core_bf16"), or empty when it has
// none.
std::string implementation(const GemmArgs& resolved, bool runtime_rows);

size_t cached_primitives();

}  // namespace sluice::cpu::onednn
