// DeviceMath on a CUDA GPU: the sluice::cuda kernels (ops.h, offload_ops.h) and cuBLASLt bf16
// GEMMs (GemmContext, whose workspace comes out of the device's budget).
#pragma once

#include <memory>

#include "kernels/cuda/gemm.h"
#include "runtime/offload/device.h"
#include "runtime/offload/device_math.h"

namespace sluice::gpu {

class CudaMath final : public offload::DeviceMath {
 public:
  explicit CudaMath(offload::Device& device);
  std::string name() const override { return "cuda"; }
  void gemm_bf16(void* stream, const offload::GemmDims& d, const uint16_t* x, const uint16_t* w,
                 float* y, float beta) override;
  void gemm_f32(void* stream, const offload::GemmDims& d, const float* x, const uint16_t* w,
                float* y, float beta) override;
  // cpu::gemm_int8's numbers from the packed int8/int4 bytes streamed to the device
  // (kernels/cuda/quant_gemm.h: X quantized per row and group on the fly, `__dp4a` dot products).
  bool supports_quantized_experts() const override { return true; }
  void gemm_quant(void* stream, const cpu::QuantView& w, int64_t m, const void* x, bool x_bf16,
                  float* y, float beta) override;
  // Row panels of W, as many rows as the tile holds, dequantised into the tile (dequantize_fp8),
  // then multiplied by the bf16 cuBLASLt GEMM (or, for fp32 X, gemm_f32_bf16w) into their
  // columns of Y.
  void gemm_fp8(void* stream, const offload::Fp8GemmArgs& a) override;
  void to_bf16(void* stream, const float* x, uint16_t* y, int64_t n) override;
  void rms_norm(void* stream, const float* x, float* y, int64_t rows, int64_t dim,
                const float* weight, float eps) override;
  void layer_norm(void* stream, const float* x, float* y, int64_t rows, int64_t dim,
                  const float* weight, float eps) override;
  void add_bias(void* stream, float* y, const float* bias, int64_t rows, int64_t cols) override;
  void clamp(void* stream, float* x, int64_t n, float limit) override;
  void sigmoid(void* stream, float* x, int64_t n) override;
  void add_scaled_rows(void* stream, const float* src, int64_t cols, const float* scales, int64_t n,
                       float* dst) override;
  void rope(void* stream, float* x, int64_t rows, int heads, int head_dim, const int32_t* positions,
            const float* inv_freq) override;
  void silu_mul(void* stream, const float* gate, const float* up, float* out, int64_t n) override;
  void route_top_k(void* stream, const cpu::RoutingArgs& a) override;
  void gather_rows_bf16(void* stream, const float* src, int64_t cols, const int32_t* rows,
                        int64_t n, uint16_t* dst) override;
  void gather_rows_f32(void* stream, const float* src, int64_t cols, const int32_t* rows, int64_t n,
                       float* dst) override;
  void scatter_add_rows(void* stream, const float* src, int64_t cols, const int32_t* rows,
                        const float* weights, int64_t n, float* dst) override;
  void write_kv(void* stream, const offload::DeviceKvLayer& kv, const float* k, const float* v,
                const int32_t* rows, const int32_t* slots, int64_t n) override;
  void paged_attention(void* stream, const offload::DeviceKvLayer& kv,
                       const offload::PagedAttentionRows& a) override;
  void argmax_rows(void* stream, const float* logits, int64_t rows, int64_t cols,
                   int32_t* out) override;
  void copy(void* stream, void* dst, const void* src, size_t bytes) override;

 private:
  offload::DeviceBuffer gemm_workspace_;
  cuda::GemmContext gemm_;
};

}  // namespace sluice::gpu
