#include "runtime/gpu/pinned_host.h"

#include "core/error.h"
#include "core/units.h"
#include "runtime/gpu/cuda_check.h"

namespace sluice::gpu {

PinnedRegistration::PinnedRegistration(const void* data, size_t bytes, bool read_only)
    : data_(const_cast<void*>(data)) {
  // Read-only registration lets the driver pin mappings of files opened read-only.
  const unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
  const cudaError_t status = cudaHostRegister(data_, bytes, flags);
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail(
        "CUDA error in cudaHostRegister of {} of weights: {}: {} (is the memlock limit, "
        "ulimit -l, large enough?)",
        human_bytes(double(bytes)), cudaGetErrorName(status), cudaGetErrorString(status));
  }
}

PinnedRegistration::~PinnedRegistration() {
  cudaHostUnregister(data_);
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  SLUICE_CUDA_CHECK(cudaMallocHost(&data_, bytes ? bytes : 1));
}

PinnedBuffer::~PinnedBuffer() {
  cudaFreeHost(data_);
}

}  // namespace sluice::gpu
