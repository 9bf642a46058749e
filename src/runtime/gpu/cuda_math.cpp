#include "runtime/gpu/cuda_math.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/offload_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quant_gemm.h"

namespace sluice::gpu {

namespace {
cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}
}  // namespace

CudaMath::CudaMath(offload::Device& device)
    : gemm_workspace_(device, cuda::GemmContext::kWorkspaceBytes, "cuBLASLt workspace"),
      gemm_(gemm_workspace_.ptr, gemm_workspace_.bytes) {}

void CudaMath::gemm_bf16(void* s, const offload::GemmDims& d, const uint16_t* x, const uint16_t* w,
                         float* y, float beta) {
  gemm_.gemm({d.m, d.n, d.k}, x, w, y, beta, as_stream(s));
}

void CudaMath::gemm_f32(void* s, const offload::GemmDims& d, const float* x, const uint16_t* w,
                        float* y, float beta) {
  cuda::gemm_f32_bf16w(x, w, y, d.m, d.n, d.k, beta, as_stream(s));
}

void CudaMath::gemm_quant(void* s, const cpu::QuantView& w, int64_t m, const void* x, bool x_bf16,
                          float* y, float beta) {
  cuda::gemm_quant({.int4 = w.format == cpu::QuantFormat::kInt4,
                    .m = m,
                    .n = w.n,
                    .k = w.k,
                    .group = w.group_size,
                    .values = w.values(),
                    .scales = w.scales(),
                    .x = x,
                    .x_bf16 = x_bf16,
                    .ldx = w.k,
                    .y = y,
                    .ldy = w.n,
                    .beta = beta},
                   as_stream(s));
}

void CudaMath::gemm_fp8(void* s, const offload::Fp8GemmArgs& a) {
  const cpu::Fp8Matrix& w = a.w;
  if (a.m == 0) return;
  if (!a.tile || a.tile_elements < w.k)
    fail(
        "cuda gemm_fp8: field 'tile': expected device scratch of at least k = {} bf16 values (one "
        "row of W), got {}",
        w.k, a.tile ? a.tile_elements : 0);
  const int64_t panel = std::min(w.n, a.tile_elements / w.k);
  for (int64_t j0 = 0; j0 < w.n; j0 += panel) {
    const int64_t rows = std::min(panel, w.n - j0);
    cuda::dequantize_fp8(w.q, w.scale, w.k, j0, rows, a.tile, as_stream(s));
    if (a.x_bf16)
      gemm_.gemm({.m = a.m, .n = rows, .k = w.k, .ldy = w.n}, static_cast<const uint16_t*>(a.x),
                 a.tile, a.y + j0, a.beta, as_stream(s));
    else
      cuda::gemm_f32_bf16w(static_cast<const float*>(a.x), a.tile, a.y + j0, a.m, rows, w.k, a.beta,
                           as_stream(s), w.n);
  }
}

void CudaMath::to_bf16(void* s, const float* x, uint16_t* y, int64_t n) {
  cuda::f32_to_bf16(x, y, n, as_stream(s));
}

void CudaMath::rms_norm(void* s, const float* x, float* y, int64_t rows, int64_t dim,
                        const float* weight, float eps) {
  cuda::rms_norm(x, y, rows, dim, weight, eps, as_stream(s));
}

void CudaMath::layer_norm(void* s, const float* x, float* y, int64_t rows, int64_t dim,
                          const float* weight, float eps) {
  cuda::layer_norm(x, y, rows, dim, weight, eps, as_stream(s));
}

void CudaMath::add_bias(void* s, float* y, const float* bias, int64_t rows, int64_t cols) {
  cuda::add_bias(y, bias, rows, cols, as_stream(s));
}

void CudaMath::clamp(void* s, float* x, int64_t n, float limit) {
  cuda::clamp(x, n, limit, as_stream(s));
}

void CudaMath::sigmoid(void* s, float* x, int64_t n) {
  cuda::sigmoid(x, n, as_stream(s));
}

void CudaMath::add_scaled_rows(void* s, const float* src, int64_t cols, const float* scales,
                               int64_t n, float* dst) {
  cuda::add_scaled_rows(src, cols, scales, n, dst, as_stream(s));
}

void CudaMath::rope(void* s, float* x, int64_t rows, int heads, int head_dim,
                    const int32_t* positions, const float* inv_freq) {
  cuda::apply_rope(x, rows, heads, head_dim, head_dim, positions, inv_freq, as_stream(s));
}

void CudaMath::silu_mul(void* s, const float* gate, const float* up, float* out, int64_t n) {
  cuda::silu_mul(gate, up, out, n, as_stream(s));
}

void CudaMath::route_top_k(void* s, const cpu::RoutingArgs& a) {
  cuda::route_top_k(a, as_stream(s));
}

void CudaMath::gather_rows_bf16(void* s, const float* src, int64_t cols, const int32_t* rows,
                                int64_t n, uint16_t* dst) {
  cuda::gather_rows_bf16(src, cols, rows, n, dst, as_stream(s));
}

void CudaMath::gather_rows_f32(void* s, const float* src, int64_t cols, const int32_t* rows,
                               int64_t n, float* dst) {
  cuda::gather_rows_f32(src, cols, rows, n, dst, as_stream(s));
}

void CudaMath::scatter_add_rows(void* s, const float* src, int64_t cols, const int32_t* rows,
                                const float* weights, int64_t n, float* dst) {
  cuda::scatter_add_rows(src, cols, rows, weights, n, dst, as_stream(s));
}

void CudaMath::write_kv(void* s, const offload::DeviceKvLayer& kv, const float* k, const float* v,
                        const int32_t* rows, const int32_t* slots, int64_t n) {
  cuda::write_kv(kv.base, kv.kv_heads, kv.head_dim, kv.block_size, k, v, rows, slots, n,
                 as_stream(s));
}

void CudaMath::paged_attention(void* s, const offload::DeviceKvLayer& kv,
                               const offload::PagedAttentionRows& a) {
  cuda::PagedAttentionArgs args;
  args.heads = a.heads;
  args.kv_heads = kv.kv_heads;
  args.head_dim = kv.head_dim;
  args.block_size = kv.block_size;
  args.sliding_window = a.sliding_window;
  args.kv = kv.base;
  args.rows = a.rows;
  args.q = a.q;
  args.out = a.out;
  args.row_pos = a.row_pos;
  args.row_table = a.row_table;
  args.tables = a.tables;
  cuda::paged_attention(args, as_stream(s));
}

void CudaMath::argmax_rows(void* s, const float* logits, int64_t rows, int64_t cols, int32_t* out) {
  cuda::argmax_rows(logits, rows, cols, out, as_stream(s));
}

void CudaMath::copy(void* s, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  SLUICE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(s)));
}

}  // namespace sluice::gpu
