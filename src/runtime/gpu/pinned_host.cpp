#include "runtime/gpu/pinned_host.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "kernels/cuda/cuda_check.h"

namespace sluice::gpu {

namespace {

bool read_only_registration_supported() {
  int device = 0, supported = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, device) !=
          cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return supported != 0;
}

}  // namespace

std::string try_pin_host_range(const void* data, size_t bytes) {
  void* p = const_cast<void*>(data);
  cudaError_t status = cudaErrorNotSupported;
  if (read_only_registration_supported()) {
    status = cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    if (status != cudaSuccess) cudaGetLastError();
  }
  if (status != cudaSuccess) {  // writable memory (a plain allocation) pins without the flag
    status = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (status != cudaSuccess) cudaGetLastError();
  }
  if (status == cudaSuccess) return "";
  return fmt::format("cudaHostRegister of {}: {}: {} (is the memlock limit, ulimit -l, too low?)",
                     human_bytes(double(bytes)), cudaGetErrorName(status),
                     cudaGetErrorString(status));
}

PinnedRegistration::PinnedRegistration(const void* data, size_t bytes)
    : data_(const_cast<void*>(data)) {
  const std::string error = try_pin_host_range(data, bytes);
  if (!error.empty()) fail("CUDA error pinning weights: {}", error);
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
