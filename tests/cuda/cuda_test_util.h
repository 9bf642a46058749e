// What the CUDA tests share: the skip on machines without a GPU, and device copies of host
// vectors. Compiled everywhere nvcc is; the tests skip, with the reason, where no GPU is.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "runtime/gpu/cuda_device.h"

// Skips the test, saying which, when cudaGetDeviceCount reports no GPU.
#define SKIP_WITHOUT_GPU(what)       \
  if (gpu::cuda_device_count() == 0) \
  GTEST_SKIP() << "no CUDA GPU (cudaGetDeviceCount reports none): " what " skipped"

namespace sluice::testing {

// A device copy of a host vector, freed at scope exit.
template <typename T>
struct DeviceVec {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceVec(const std::vector<T>& host) : n(host.size()) {
    SLUICE_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(1, n) * sizeof(T)));
    if (n) SLUICE_CUDA_CHECK(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceVec() { cudaFree(ptr); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  std::vector<T> get() const {
    std::vector<T> out(n);
    SLUICE_CUDA_CHECK(cudaDeviceSynchronize());
    if (n) SLUICE_CUDA_CHECK(cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

}  // namespace sluice::testing
