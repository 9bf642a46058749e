// CUDA and cuBLAS error checking: a failed call becomes a sluice::Error naming the operation
// (the call's source text), where it was made and CUDA's own message, so the command line prints
// it and exits with status 1 instead of aborting.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace sluice::gpu {

void cuda_check(cudaError_t status, const char* operation, const char* file, int line);
void cublas_check(cublasStatus_t status, const char* operation, const char* file, int line);

// GPUs the process can use; 0 when there is no GPU or no usable driver (never an error).
int cuda_device_count();

}  // namespace sluice::gpu

#define SLUICE_CUDA_CHECK(call) ::sluice::gpu::cuda_check((call), #call, __FILE__, __LINE__)
#define SLUICE_CUBLAS_CHECK(call) ::sluice::gpu::cublas_check((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports launch-configuration errors at the launch site.
#define SLUICE_CUDA_CHECK_LAUNCH(what) \
  ::sluice::gpu::cuda_check(cudaGetLastError(), what, __FILE__, __LINE__)
