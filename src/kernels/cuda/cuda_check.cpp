#include "kernels/cuda/cuda_check.h"

#include "core/error.h"
#include "kernels/cuda/cublaslt_library.h"

namespace sluice::gpu {

void cuda_check(cudaError_t status, const char* operation, const char* file, int line) {
  if (status == cudaSuccess) return;
  // A failed runtime call also becomes the thread's last error; clear it (a non-sticky one), or
  // the next SLUICE_CUDA_CHECK_LAUNCH, whose cudaGetLastError reads it, would report it again
  // against an unrelated kernel after the caller caught this one.
  cudaGetLastError();
  fail("CUDA error in {} ({}:{}): {}: {}", operation, file, line, cudaGetErrorName(status),
       cudaGetErrorString(status));
}

void cublas_check(cublasStatus_t status, const char* operation, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const cuda::CublasLt& lt = cuda::cublaslt();
  fail("cuBLAS error in {} ({}:{}): {}: {}", operation, file, line, lt.get_status_name(status),
       lt.get_status_string(status));
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" status
    return 0;
  }
  return n;
}

}  // namespace sluice::gpu
