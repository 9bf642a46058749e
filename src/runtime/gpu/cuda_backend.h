// Opens the CUDA offload backend: the first GPU as an offload::Device and CudaMath on it. This
// header names no CUDA type, so generic code can call it under #if SLUICE_HAS_CUDA.
#pragma once

#include <cstddef>
#include <memory>

#include "runtime/offload/device.h"
#include "runtime/offload/device_math.h"

namespace sluice::gpu {

struct CudaBackend {
  std::unique_ptr<offload::Device> device;
  std::unique_ptr<offload::DeviceMath> math;  // reset before device
};

// budget_bytes 0: 90% of the GPU's free memory. Fails when no GPU is usable.
CudaBackend open_cuda_backend(size_t budget_bytes);

// Whether a CUDA GPU is usable here (a driver and at least one device).
bool cuda_gpu_usable();

}  // namespace sluice::gpu
