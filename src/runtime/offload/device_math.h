// The kernels one engine step needs on a Device, each enqueued on a queue's `stream` over device
// pointers. Two implementations: HostMath (host_math.h), which calls kernels/cpu and is paired
// with the CPU stand-in device (whose "device" memory is host memory), and CudaMath
// (runtime/gpu/cuda_math.h) on sluice::cuda kernels and cuBLASLt.
//
// Every function mirrors the CPU engine's call at the same point, with the same rounding: HostMath
// makes the stand-in engine compute the CPU engine's numbers, and CudaMath is checked against it.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/gemm_fp8.h"
#include "kernels/cpu/gemm_int8.h"
#include "kernels/cpu/routing.h"

namespace sluice::offload {

struct GemmDims {
  int64_t m = 0, n = 0, k = 0;  // Y[m, n] = X[m, k] · W[n, k]ᵀ (nn.Linear layout, W bf16)
};

// One layer of a device KV pool, laid out as the host PagedKvCache's layer
// ([block][K|V][kv_head][slot][head_dim] bf16), and its shape.
struct DeviceKvLayer {
  uint16_t* base = nullptr;
  int kv_heads = 0, head_dim = 0, block_size = 0;
};

// Attention of `rows` query rows over a device KV pool layer, row by row (the GPU share of
// attention). Row r at position row_pos[r] sees keys [0, row_pos[r]] (and, with a sliding
// window, only the last `sliding_window` of them) through the block table that starts at
// tables[row_table[r]]. q and out are [rows, heads, head_dim] fp32.
struct PagedAttentionRows {
  int heads = 0, sliding_window = 0;
  int64_t rows = 0;
  const float* q = nullptr;
  float* out = nullptr;
  const int32_t* row_pos = nullptr;
  const int32_t* row_table = nullptr;
  const int32_t* tables = nullptr;
};

// A GEMM against FP8 e4m3 weights with 128 × 128 block scales (DeepSeek-V3 and R1's projections):
// Y = X · Wᵀ + beta · Y with W dequantised as cpu::gemm_fp8 does, bf16(code · block scale), and
// fp32 sums. w.q and w.scale are device pointers: the codes and scales as the host holds and
// streams them, 1 byte per weight (the whole matrix is never held in bf16).
struct Fp8GemmArgs {
  cpu::Fp8Matrix w;
  int64_t m = 0;
  const void* x = nullptr;  // [m, w.k]: bf16 (x_bf16), or fp32 used as it is (f32 precision)
  bool x_bf16 = true;
  float* y = nullptr;  // fp32 [m, w.n]
  float beta = 0.0f;
  // Device scratch of at least w.k bf16 values, where an implementation may dequantise row
  // panels of W for a bf16 GEMM (CudaMath does; HostMath's kernel has its own cache-sized ones).
  uint16_t* tile = nullptr;
  int64_t tile_elements = 0;
};

class DeviceMath {
 public:
  virtual ~DeviceMath() = default;
  virtual std::string name() const = 0;

  // Y (fp32) = X (bf16) · Wᵀ + beta · Y, fp32 accumulation (cpu::gemm with bf16 X).
  virtual void gemm_bf16(void* stream, const GemmDims& d, const uint16_t* x, const uint16_t* w,
                         float* y, float beta) = 0;
  // Y = X · Wᵀ + beta · Y with fp32 X used as is, against bf16 W (cpu::gemm_f32). The router
  // always runs this way (its top-k is discontinuous in its input), and every GEMM does in f32
  // precision. On CUDA a plain kernel, not cuBLAS: cuBLAS has no fp32 × bf16 mixed GEMM, and the
  // router is a few experts wide.
  virtual void gemm_f32(void* stream, const GemmDims& d, const float* x, const uint16_t* w,
                        float* y, float beta) = 0;

  // Quantized expert weights (--expert-dtype int8/int4): Y = X · dequant(W)ᵀ + beta · Y with W
  // the packed matrix `w` (w.data a device pointer to the bytes the host holds and streams,
  // cpu::QuantView's layout) and X [m, w.k] bf16 (x_bf16) or fp32, quantized to int8 per row and
  // group on the fly (cpu::gemm_int8, whose numbers an implementation must reproduce).
  // supports_quantized_experts() says whether it has a kernel; the executor refuses quantized
  // experts before anything runs when not.
  virtual bool supports_quantized_experts() const { return false; }
  virtual void gemm_quant(void* stream, const cpu::QuantView& w, int64_t m, const void* x,
                          bool x_bf16, float* y, float beta) = 0;

  // Fp8GemmArgs' GEMM (cpu::gemm_fp8, with X rounded to bf16 before the call or kept fp32).
  virtual void gemm_fp8(void* stream, const Fp8GemmArgs& a) = 0;

  // y[i] = bf16(x[i]), round to nearest even (cpu::f32_to_bf16_row).
  virtual void to_bf16(void* stream, const float* x, uint16_t* y, int64_t n) = 0;
  // cpu::rms_norm with fp32 weights over `rows` rows of `dim`; y may equal x.
  virtual void rms_norm(void* stream, const float* x, float* y, int64_t rows, int64_t dim,
                        const float* weight, float eps) = 0;
  // cpu::layer_norm (LayerNorm without bias) with fp32 weights; y may equal x.
  virtual void layer_norm(void* stream, const float* x, float* y, int64_t rows, int64_t dim,
                          const float* weight, float eps) = 0;
  // y[r, i] += bias[i] over `rows` rows of `cols` (a projection's bias, after its GEMM).
  virtual void add_bias(void* stream, float* y, const float* bias, int64_t rows, int64_t cols) = 0;
  // x[i] = clamp(x[i], -limit, limit), in place (x.clamp_(min=-limit, max=limit)).
  virtual void clamp(void* stream, float* x, int64_t n, float limit) = 0;
  // x[i] = 1 / (1 + exp(-x[i])), in place (F.sigmoid).
  virtual void sigmoid(void* stream, float* x, int64_t n) = 0;
  // dst[j] += scales[j] · src[j] over n rows of `cols` (a dense MLP's output into the residual,
  // scaled per row by its gate); scales null: 1.
  virtual void add_scaled_rows(void* stream, const float* src, int64_t cols, const float* scales,
                               int64_t n, float* dst) = 0;
  // cpu::apply_rope over the whole head (rotary_dim = head_dim), in place.
  virtual void rope(void* stream, float* x, int64_t rows, int heads, int head_dim,
                    const int32_t* positions, const float* inv_freq) = 0;
  // cpu::silu_mul; out may alias gate or up.
  virtual void silu_mul(void* stream, const float* gate, const float* up, float* out,
                        int64_t n) = 0;
  // cpu::route_top_k (kernels/cpu/routing.h) with its rule: the score function, the selection
  // bias, groups and scale of `a`; a's pointers (logits, bias, ids, weights) are device memory.
  virtual void route_top_k(void* stream, const cpu::RoutingArgs& a) = 0;

  // dst[j] = src[rows[j]] for j < n, rows of `cols`: an expert's tokens as its GEMM input, rounded
  // to bf16 or kept in fp32.
  virtual void gather_rows_bf16(void* stream, const float* src, int64_t cols, const int32_t* rows,
                                int64_t n, uint16_t* dst) = 0;
  virtual void gather_rows_f32(void* stream, const float* src, int64_t cols, const int32_t* rows,
                               int64_t n, float* dst) = 0;
  // dst[rows[j]] += weights[j] · src[j] (the CPU engine's expert scatter-add); rows distinct.
  virtual void scatter_add_rows(void* stream, const float* src, int64_t cols, const int32_t* rows,
                                const float* weights, int64_t n, float* dst) = 0;
  // Stores K and V rows into a device KV pool layer, rounded to bf16 (PagedKvCache::write_tokens):
  // row j of the pool write is rows[j] of k and v ([*, kv_heads·head_dim] fp32), into pool slot
  // slots[j] = block · block_size + position % block_size.
  virtual void write_kv(void* stream, const DeviceKvLayer& kv, const float* k, const float* v,
                        const int32_t* rows, const int32_t* slots, int64_t n) = 0;
  // kernels/cpu/attention.h's paged attention over a device pool layer (the scale 1/√head_dim).
  virtual void paged_attention(void* stream, const DeviceKvLayer& kv,
                               const PagedAttentionRows& a) = 0;
  // Greedy sampling: out[r] = the index of row r's largest logit, the lowest among equal maxima
  // (sluice::argmax, what Sampler picks at temperature 0).
  virtual void argmax_rows(void* stream, const float* logits, int64_t rows, int64_t cols,
                           int32_t* out) = 0;
  // Device-to-device copy in queue order.
  virtual void copy(void* stream, void* dst, const void* src, size_t bytes) = 0;
};

}  // namespace sluice::offload
