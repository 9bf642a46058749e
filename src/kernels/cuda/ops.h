// CUDA kernels of the forward pass. Every pointer is device memory; every function enqueues on
// `stream` and returns at once. Each mirrors a CPU kernel in kernels/cpu/ (named per function)
// and is tested against it (tests/cuda/).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/routing.h"

namespace sluice::cuda {

// cpu::rms_norm with fp32 weights: y = w ⊙ x / sqrt(mean(x²) + eps), rows of `dim` floats.
void rms_norm(const float* x, float* y, int64_t rows, int64_t dim, const float* weight, float eps,
              cudaStream_t stream);

// cpu::layer_norm with fp32 weights (LayerNorm without bias): y = w ⊙ (x - mean) / sqrt(var + eps).
void layer_norm(const float* x, float* y, int64_t rows, int64_t dim, const float* weight, float eps,
                cudaStream_t stream);
// y[r, i] += bias[i] over `rows` rows of `cols`.
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
// x[i] = clamp(x[i], -limit, limit), in place.
void clamp(float* x, int64_t n, float limit, cudaStream_t stream);
// x[i] = 1 / (1 + exp(-x[i])), in place.
void sigmoid(float* x, int64_t n, cudaStream_t stream);
// dst[j] += scales[j] · src[j] over n rows of `cols` (scales null: 1).
void add_scaled_rows(const float* src, int64_t cols, const float* scales, int64_t n, float* dst,
                     cudaStream_t stream);

// cpu::apply_rope (rotate-half, fp32 angle float(pos)·inv_freq[i], cos/sin evaluated in double
// and rounded, no FMA contraction): rotates x [rows, n_heads, head_dim] in place.
void apply_rope(float* x, int64_t rows, int n_heads, int head_dim, int rotary_dim,
                const int32_t* positions, const float* inv_freq, cudaStream_t stream);

// cpu::silu_mul: out = silu(gate) ⊙ up over n elements; out may alias gate or up.
void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// cpu::route_top_k: softmax over n_experts logits per token, top-k (lowest id on ties),
// optionally renormalised.
void route_top_k(const float* logits, int64_t tokens, int n_experts, int top_k, bool renormalize,
                 int32_t* expert_ids, float* weights, cudaStream_t stream);
// cpu::route_top_k with the whole rule of `a` (sigmoid scores, selection bias, groups, scale;
// its pointers device memory): the plain rule through the kernel above, the others one thread
// per token over at most kMaxRuleExperts experts.
constexpr int kMaxRuleExperts = 512;
void route_top_k(const cpu::RoutingArgs& a, cudaStream_t stream);

// dst[j] = bf16(src[rows[j]]) for j < n: an expert's tokens gathered as its GEMM input.
void gather_rows_bf16(const float* src, int64_t cols, const int32_t* rows, int64_t n, uint16_t* dst,
                      cudaStream_t stream);
// dst[rows[j]] += weights[j] · src[j]: an expert's output added to the residual. The rows of one
// call must be distinct (a token meets each expert once); calls on one stream are ordered.
void scatter_add_rows(const float* src, int64_t cols, const int32_t* rows, const float* weights,
                      int64_t n, float* dst, cudaStream_t stream);

// Greedy sampling: out[r] = argmax of row r (lowest index among equal maxima, as sluice::argmax).
void argmax_rows(const float* logits, int64_t rows, int64_t cols, int32_t* out,
                 cudaStream_t stream);

}  // namespace sluice::cuda
