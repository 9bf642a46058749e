// The GPU half of `sluice profile`: copy bandwidths over PCIe (pinned and pageable host memory,
// both directions), device memory bandwidth, bf16 GEMM time versus m on cuBLASLt for the weight
// shapes the CPU profile uses, and free device memory. Plain C++ interface (no CUDA headers), so
// the command line can register it under #if SLUICE_HAS_CUDA.
#pragma once

#include <optional>

#include "runtime/planner/hardware_profile.h"

namespace sluice::gpu {

// Measures GPU 0 (a few seconds); nullopt, quietly, when there is no usable GPU.
std::optional<GpuProfile> measure_gpu_profile();

}  // namespace sluice::gpu
