#include "runtime/offload/host_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/gemm_fp8.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/routing.h"

namespace sluice::offload {

void HostMath::gemm_bf16(void*, const GemmDims& d, const uint16_t* x, const uint16_t* w, float* y,
                         float beta) {
  cpu::GemmArgs a;
  a.m = d.m;
  a.n = d.n;
  a.k = d.k;
  a.x = x;
  a.x_dtype = DType::BF16;
  a.w = w;
  a.y = y;
  a.beta = beta;
  cpu::gemm(a);
}

void HostMath::gemm_f32(void*, const GemmDims& d, const float* x, const uint16_t* w, float* y,
                        float beta) {
  cpu::gemm_f32({d.m, d.n, d.k, x, w, y, beta});
}

// The stand-in's "device" GEMM reads the packed bytes that were streamed into its page (or
// copied into its resident memory) and runs the CPU engine's kernel on them.
void HostMath::gemm_quant(void*, const cpu::QuantView& w, int64_t m, const void* x, bool x_bf16,
                          float* y, float beta) {
  cpu::gemm_int8({.m = m,
                  .x = x,
                  .x_dtype = x_bf16 ? DType::BF16 : DType::F32,
                  .w = &w,
                  .y = y,
                  .beta = beta});
}

// The FP8 codes and scales in the stand-in's "device" memory, through the CPU engine's kernel
// (its own panels, not the tile); fp32 X is the f32 precision's, used as it is.
void HostMath::gemm_fp8(void*, const Fp8GemmArgs& a) {
  cpu::gemm_fp8({.m = a.m,
                 .x = a.x,
                 .x_dtype = a.x_bf16 ? DType::BF16 : DType::F32,
                 .w = &a.w,
                 .y = a.y,
                 .beta = a.beta,
                 .round_x_to_bf16 = false});
}

void HostMath::to_bf16(void*, const float* x, uint16_t* y, int64_t n) {
  cpu::f32_to_bf16_row(x, y, size_t(n));
}

namespace {

// The CPU kernels' arguments for rows of `dim` fp32 values with an fp32 weight.
cpu::RmsNormArgs norm_args(const float* x, float* y, int64_t rows, int64_t dim,
                           const float* weight, float eps) {
  cpu::RmsNormArgs a;
  a.x = x;
  a.y = y;
  a.rows = rows;
  a.dim = dim;
  a.weight = weight;
  a.weight_dtype = DType::F32;
  a.eps = eps;
  return a;
}

}  // namespace

void HostMath::rms_norm(void*, const float* x, float* y, int64_t rows, int64_t dim,
                        const float* weight, float eps) {
  cpu::rms_norm(norm_args(x, y, rows, dim, weight, eps));
}

void HostMath::layer_norm(void*, const float* x, float* y, int64_t rows, int64_t dim,
                          const float* weight, float eps) {
  cpu::layer_norm(norm_args(x, y, rows, dim, weight, eps));
}

void HostMath::add_bias(void*, float* y, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < cols; ++i) y[r * cols + i] += bias[i];
}

void HostMath::clamp(void*, float* x, int64_t n, float limit) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::clamp(x[i], -limit, limit);
}

void HostMath::sigmoid(void*, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

void HostMath::add_scaled_rows(void*, const float* src, int64_t cols, const float* scales,
                               int64_t n, float* dst) {
  for (int64_t j = 0; j < n; ++j) {
    const float s = scales ? scales[j] : 1.0f;
    for (int64_t i = 0; i < cols; ++i) dst[j * cols + i] += s * src[j * cols + i];
  }
}

void HostMath::rope(void*, float* x, int64_t rows, int heads, int head_dim,
                    const int32_t* positions, const float* inv_freq) {
  cpu::RopeArgs a;
  a.x = x;
  a.rows = rows;
  a.n_heads = heads;
  a.head_dim = head_dim;
  a.positions = positions;
  a.inv_freq = inv_freq;
  cpu::apply_rope(a);
}

void HostMath::silu_mul(void*, const float* gate, const float* up, float* out, int64_t n) {
  cpu::silu_mul(gate, up, out, n);
}

void HostMath::route_top_k(void*, const cpu::RoutingArgs& a) {
  cpu::route_top_k(a);
}

void HostMath::gather_rows_bf16(void*, const float* src, int64_t cols, const int32_t* rows,
                                int64_t n, uint16_t* dst) {
  for (int64_t j = 0; j < n; ++j)
    cpu::f32_to_bf16_row(src + int64_t(rows[j]) * cols, dst + j * cols, size_t(cols));
}

void HostMath::gather_rows_f32(void*, const float* src, int64_t cols, const int32_t* rows,
                               int64_t n, float* dst) {
  for (int64_t j = 0; j < n; ++j) std::copy_n(src + int64_t(rows[j]) * cols, cols, dst + j * cols);
}

void HostMath::scatter_add_rows(void*, const float* src, int64_t cols, const int32_t* rows,
                                const float* weights, int64_t n, float* dst) {
  for (int64_t j = 0; j < n; ++j) {
    float* d = dst + int64_t(rows[j]) * cols;
    const float* s = src + j * cols;
    const float w = weights[j];
    for (int64_t i = 0; i < cols; ++i) d[i] += w * s[i];
  }
}

void HostMath::write_kv(void*, const DeviceKvLayer& kv, const float* k, const float* v,
                        const int32_t* rows, const int32_t* slots, int64_t n) {
  const cpu::KvLayerView view{kv.base, kv.block_size, kv.kv_heads, kv.head_dim};
  const int64_t d = kv.head_dim, row = int64_t(kv.kv_heads) * d;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t block = slots[j] / kv.block_size;
    const int64_t slot = slots[j] % kv.block_size;
    for (int h = 0; h < kv.kv_heads; ++h) {
      const int64_t at = view.k_tile(block, h) - view.base + slot * d;
      const int64_t v_at = view.v_tile(block, h) - view.base + slot * d;
      cpu::f32_to_bf16_row(k + rows[j] * row + h * d, kv.base + at, size_t(d));
      cpu::f32_to_bf16_row(v + rows[j] * row + h * d, kv.base + v_at, size_t(d));
    }
  }
}

// The rows of one sequence in a step are consecutive positions over one block table: they are
// joined back into the CPU engine's AttentionSequence, so the kernel call is the engine's.
void HostMath::paged_attention(void*, const DeviceKvLayer& kv, const PagedAttentionRows& a) {
  const int64_t width = int64_t(a.heads) * kv.head_dim;
  std::vector<cpu::AttentionSequence> seqs;
  for (int64_t r = 0; r < a.rows;) {
    int64_t end = r + 1;
    while (end < a.rows && a.row_table[end] == a.row_table[r] &&
           a.row_pos[end] == a.row_pos[end - 1] + 1)
      ++end;
    cpu::AttentionSequence s;
    s.q = a.q + r * width;
    s.out = a.out + r * width;
    s.n_q = int(end - r);
    s.q_start = a.row_pos[r];
    s.kv_len = a.row_pos[end - 1] + 1;
    s.block_table = {a.tables + a.row_table[r],
                     size_t((s.kv_len + kv.block_size - 1) / kv.block_size)};
    seqs.push_back(s);
    r = end;
  }
  cpu::AttentionParams params;
  params.heads = a.heads;
  params.kv_heads = kv.kv_heads;
  params.head_dim = kv.head_dim;
  params.sliding_window = a.sliding_window;
  cpu::paged_attention(params, {kv.base, kv.block_size, kv.kv_heads, kv.head_dim}, seqs);
}

void HostMath::argmax_rows(void*, const float* logits, int64_t rows, int64_t cols, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {  // max_element: the first of equal maxima
    const float* row = logits + r * cols;
    out[r] = int32_t(std::max_element(row, row + cols) - row);
  }
}

void HostMath::copy(void*, void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

}  // namespace sluice::offload
