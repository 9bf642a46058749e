#include "runtime/gpu/cuda_backend.h"

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "runtime/gpu/cuda_device.h"
#include "runtime/gpu/cuda_math.h"

namespace sluice::gpu {

bool cuda_gpu_usable() {
  return cuda_device_count() > 0;
}

CudaBackend open_cuda_backend(size_t budget_bytes) {
  if (cuda_device_count() == 0)
    fail("--device cuda: no CUDA GPU is usable on this machine; use --device cpu");
  if (budget_bytes == 0) {
    SLUICE_CUDA_CHECK(cudaSetDevice(0));
    size_t free_bytes = 0, total_bytes = 0;
    SLUICE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    budget_bytes = free_bytes / 10 * 9;  // the rest for the CUDA context's own allocations
  }
  CudaBackend b;
  b.device = std::make_unique<CudaDevice>(0, budget_bytes);
  b.math = std::make_unique<CudaMath>(*b.device);
  return b;
}

}  // namespace sluice::gpu
