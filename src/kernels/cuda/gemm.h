// bf16 GEMMs on cuBLASLt, in the nn.Linear layout of kernels/cpu/gemm.h:
//   Y[m, n] (fp32) = X[m, k] (bf16) · W[n, k]ᵀ (bf16) + beta · Y,  fp32 accumulation.
// Row-major Y is column-major Yᵀ = W · Xᵀ, so cuBLASLt sees A = W (transposed), B = X.
// Matmul descriptors and the heuristic's algorithm are cached per shape: the engine calls with a
// different m per expert, and the heuristic query costs more than a small GEMM.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>

namespace sluice::cuda {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  int64_t ldy = 0;  // Y's row stride in elements; 0: n (a panel of W's rows writes a column block)
};

class GemmContext {
 public:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
  // `workspace`: device memory the caller owns (and charges to its budget) for the context's life.
  GemmContext(void* workspace, size_t workspace_bytes);
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  void gemm(const GemmShape& s, const uint16_t* x, const uint16_t* w, float* y, float beta,
            cudaStream_t stream);

  // One expert's GEMM per entry, over all of that expert's tokens (m differs per expert). The
  // calls are issued back to back on one stream; each is large enough (thousands of rows at
  // high batch) that a grouped kernel would gain little over consecutive launches.
  struct ExpertGemm {
    int64_t m = 0;
    const uint16_t* x = nullptr;
    const uint16_t* w = nullptr;
    float* y = nullptr;
  };
  void expert_gemms(int64_t n, int64_t k, std::span<const ExpertGemm> experts, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::cuda
