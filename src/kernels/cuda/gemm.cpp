#include "kernels/cuda/gemm.h"

#include <map>
#include <tuple>

#include "core/error.h"
#include "kernels/cuda/cublaslt_library.h"
#include "kernels/cuda/cuda_check.h"

namespace sluice::cuda {

namespace {

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address.
// The heuristic may otherwise pick a kernel that needs 256-byte aligned operands, and the
// executor passes row offsets into its buffers (e.g. v after n rows of k, n·kv_dim·4 bytes).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

}  // namespace

struct GemmContext::Impl {
  const CublasLt& lt = cublaslt();  // opened by the first GPU GEMM context
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Shape, Y's row stride, accumulate, and the alignments of W, X and Y.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, uint32_t, uint32_t, uint32_t>, Plan>
      plans;

  Impl(void* ws, size_t ws_bytes) : workspace(ws), workspace_bytes(ws_bytes) {
    SLUICE_CUBLAS_CHECK(lt.create(&handle));
  }
  ~Impl() {
    for (auto& [key, p] : plans) {
      lt.matrix_layout_destroy(p.a);
      lt.matrix_layout_destroy(p.b);
      lt.matrix_layout_destroy(p.c);
      lt.matmul_desc_destroy(p.op);
    }
    lt.destroy(handle);
  }

  const Plan& plan(const GemmShape& s, bool accumulate, uint32_t align_w, uint32_t align_x,
                   uint32_t align_y) {
    auto key = std::make_tuple(s.m, s.n, s.k, s.ldy, accumulate, align_w, align_x, align_y);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan p;
    SLUICE_CUBLAS_CHECK(lt.matmul_desc_create(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    SLUICE_CUBLAS_CHECK(lt.matmul_desc_set_attribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                       &transpose, sizeof(transpose)));
    SLUICE_CUBLAS_CHECK(
        lt.matmul_desc_set_attribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
    // Column-major: A = W stored k×n (ld k), used transposed; B = X stored k×m (ld k);
    // C = Y stored n×m (ld ldy, n by default).
    SLUICE_CUBLAS_CHECK(
        lt.matrix_layout_create(&p.a, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.n), s.k));
    SLUICE_CUBLAS_CHECK(
        lt.matrix_layout_create(&p.b, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.m), s.k));
    SLUICE_CUBLAS_CHECK(lt.matrix_layout_create(&p.c, CUDA_R_32F, uint64_t(s.n), uint64_t(s.m),
                                                s.ldy ? s.ldy : s.n));
    cublasLtMatmulPreference_t pref = nullptr;
    SLUICE_CUBLAS_CHECK(lt.matmul_preference_create(&pref));
    SLUICE_CUBLAS_CHECK(lt.matmul_preference_set_attribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
    for (auto [attribute, align] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
                                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_x},
                                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_y},
                                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_y}})
      SLUICE_CUBLAS_CHECK(
          lt.matmul_preference_set_attribute(pref, attribute, &align, sizeof(align)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        lt.matmul_algo_get_heuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    lt.matmul_preference_destroy(pref);
    SLUICE_CUBLAS_CHECK(status);
    if (found == 0)
      fail(
          "cuBLASLt: no bf16 GEMM algorithm for m={} n={} k={} with operands aligned to {}, {} "
          "and {} bytes",
          s.m, s.n, s.k, align_w, align_x, align_y);
    p.algo = result.algo;
    return plans.emplace(key, p).first->second;
  }
};

GemmContext::GemmContext(void* workspace, size_t workspace_bytes)
    : impl_(std::make_unique<Impl>(workspace, workspace_bytes)) {}
GemmContext::~GemmContext() = default;

void GemmContext::gemm(const GemmShape& s, const uint16_t* x, const uint16_t* w, float* y,
                       float beta, cudaStream_t stream) {
  if (s.m == 0) return;
  if (s.n <= 0 || s.k <= 0 || (s.ldy != 0 && s.ldy < s.n))
    fail("cuda gemm: field 'shape': expected n, k > 0 and ldy 0 or >= n, got m={} n={} k={} ldy={}",
         s.m, s.n, s.k, s.ldy);
  const Plan& p = impl_->plan(s, beta != 0.0f, alignment_of(w), alignment_of(x), alignment_of(y));
  const float alpha = 1.0f;
  SLUICE_CUBLAS_CHECK(impl_->lt.matmul(impl_->handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y,
                                     p.c, &p.algo, impl_->workspace, impl_->workspace_bytes,
                                     stream));
}

void GemmContext::expert_gemms(int64_t n, int64_t k, std::span<const ExpertGemm> experts,
                               cudaStream_t stream) {
  for (const ExpertGemm& e : experts) gemm({e.m, n, k}, e.x, e.w, e.y, 0.0f, stream);
}

}  // namespace sluice::cuda
