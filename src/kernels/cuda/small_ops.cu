// Element-wise and per-row kernels. Sizes are small next to the GEMMs, so the kernels are plain:
// one block per row for reductions, a grid-stride loop for element-wise work.
#include <cfloat>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace sluice::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  return int((n + kThreads - 1) / kThreads < 65535 ? (n + kThreads - 1) / kThreads : 65535);
}

__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? shared[lane] : 0.0f;
  if (warp == 0)
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) shared[0] = v;
  __syncthreads();
  const float total = shared[0];
  __syncthreads();
  return total;
}

__global__ void rms_norm_kernel(const float* x, float* y, int64_t dim, const float* w, float eps) {
  __shared__ float shared[32];
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float sum = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += xr[i] * xr[i];
  sum = block_sum(sum, shared);
  const float inv_rms = 1.0f / sqrtf(sum / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv_rms * w[i];
}

// Two passes as cpu::layer_norm: the mean, then the centred squares.
__global__ void layer_norm_kernel(const float* x, float* y, int64_t dim, const float* w,
                                  float eps) {
  __shared__ float shared[32];
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float sum = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += xr[i];
  const float mean = block_sum(sum, shared) / float(dim);
  float squares = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    squares += (xr[i] - mean) * (xr[i] - mean);
  const float inv_std = 1.0f / sqrtf(block_sum(squares, shared) / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (xr[i] - mean) * inv_std * w[i];
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t cols) {
  float* yr = y + blockIdx.x * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = __fadd_rn(yr[i], bias[i]);
}

__global__ void clamp_kernel(float* x, int64_t n, float limit) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = fminf(fmaxf(x[i], -limit), limit);
}

// exp in double, rounded: the correctly rounded fp32 exp the host's expf gives (almost always).
__global__ void sigmoid_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, float(exp(-double(x[i])))));
}

__global__ void add_scaled_rows_kernel(const float* src, int64_t cols, const float* scales,
                                       float* dst) {
  const float* s = src + int64_t(blockIdx.x) * cols;
  float* d = dst + int64_t(blockIdx.x) * cols;
  const float w = scales ? scales[blockIdx.x] : 1.0f;
  // Rounded product, then the add, as the CPU engine's loop.
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    d[i] = __fadd_rn(d[i], __fmul_rn(w, s[i]));
}

__global__ void rope_kernel(float* x, int n_heads, int head_dim, int half, const int32_t* positions,
                            const float* inv_freq) {
  const int64_t row = blockIdx.x;
  const float pos = float(positions[row]);
  for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const float angle = __fmul_rn(pos, inv_freq[i]);  // the fp32 product, as torch computes it
    const float c = float(cos(double(angle))), s = float(sin(double(angle)));
    float* v = x + (row * n_heads + h) * head_dim;
    const float lo = v[i], hi = v[i + half];
    // Rounded products then one add, like the CPU kernel (no FMA contraction).
    v[i] = __fsub_rn(__fmul_rn(lo, c), __fmul_rn(hi, s));
    v[i + half] = __fadd_rn(__fmul_rn(hi, c), __fmul_rn(lo, s));
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

// One thread per token: E is at most a few hundred, and the sequential fp32 sums keep the order
// of operations of the CPU kernel.
__global__ void route_kernel(const float* logits, int64_t tokens, int E, int K, bool renormalize,
                             int32_t* ids, float* weights) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  const float* l = logits + t * E;
  float max_logit = -INFINITY;
  for (int e = 0; e < E; ++e) max_logit = fmaxf(max_logit, l[e]);
  float sum = 0;
  for (int e = 0; e < E; ++e) sum += expf(l[e] - max_logit);
  float chosen_sum = 0, prev = INFINITY;
  int prev_id = -1;
  for (int j = 0; j < K; ++j) {
    // The next in (probability desc, id asc) order after (prev, prev_id).
    int best = -1;
    float best_p = 0;
    for (int e = 0; e < E; ++e) {
      const float p = expf(l[e] - max_logit) / sum;
      const bool after_prev = p < prev || (p == prev && e > prev_id);
      if (after_prev && (best < 0 || p > best_p)) {
        best = e;
        best_p = p;
      }
    }
    ids[t * K + j] = best;
    weights[t * K + j] = best_p;
    chosen_sum += best_p;
    prev = best_p;
    prev_id = best;
  }
  if (renormalize)
    for (int j = 0; j < K; ++j) weights[t * K + j] /= chosen_sum;
}

// cpu::route_top_k's general path, in its order of operations: scores, choice = score + bias,
// groups ranked by their best choice or best two (experts outside the best groups_per_token at
// choice 0), the top-k of the choice (lowest id on ties) weighted by their scores, renormalised
// and scaled. One thread per token, its arrays in local memory.
__global__ void route_rule_kernel(const float* logits, int64_t tokens, int E, int K,
                                  cpu::RoutingArgs a) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  float score[kMaxRuleExperts], choice[kMaxRuleExperts];
  const float* l = logits + t * E;
  if (a.score == cpu::RouterScoreFn::kSigmoid) {
    for (int e = 0; e < E; ++e) score[e] = 1.0f / (1.0f + expf(-l[e]));
  } else {
    float max_logit = -INFINITY, sum = 0;
    for (int e = 0; e < E; ++e) max_logit = fmaxf(max_logit, l[e]);
    for (int e = 0; e < E; ++e) sum += (score[e] = expf(l[e] - max_logit));
    for (int e = 0; e < E; ++e) score[e] /= sum;
  }
  for (int e = 0; e < E; ++e) {
    if (isnan(score[e])) score[e] = 0;
    choice[e] = score[e] + (a.selection_bias ? a.selection_bias[e] : 0.0f);
  }
  if (a.groups > 1) {
    const int per_group = E / a.groups;
    unsigned char kept[kMaxRuleExperts];
    float rank[kMaxRuleExperts];
    for (int g = 0; g < a.groups; ++g) {
      float best = -INFINITY, second = -INFINITY;
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
        if (choice[e] > best) {
          second = best;
          best = choice[e];
        } else if (choice[e] > second) {
          second = choice[e];
        }
      }
      rank[g] = a.group_rank == cpu::GroupRank::kBest ? best : best + second;
      kept[g] = 0;
    }
    for (int j = 0; j < a.groups_per_token; ++j) {
      int best = -1;
      for (int g = 0; g < a.groups; ++g)
        if (!kept[g] && (best < 0 || rank[g] > rank[best])) best = g;
      kept[best] = 1;
    }
    for (int e = 0; e < E; ++e)
      if (!kept[e / per_group]) choice[e] = 0.0f;
  }
  int32_t* ids = a.expert_ids + t * K;
  float* w = a.weights + t * K;
  for (int j = 0; j < K; ++j) {
    int best = 0;
    for (int e = 1; e < E; ++e)
      if (choice[e] > choice[best]) best = e;
    ids[j] = best;
    w[j] = score[best];
    choice[best] = -INFINITY;
  }
  if (a.renormalize) {
    float chosen_sum = 0;
    for (int j = 0; j < K; ++j) chosen_sum += w[j];
    for (int j = 0; j < K; ++j) w[j] /= chosen_sum;
  }
  if (a.scale != 1.0f)
    for (int j = 0; j < K; ++j) w[j] *= a.scale;
}

__device__ uint16_t to_bf16(float f) {  // round to nearest even, as core/dtype.h; NaN kept
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__global__ void gather_kernel(const float* src, int64_t cols, const int32_t* rows, uint16_t* dst) {
  const float* s = src + int64_t(rows[blockIdx.x]) * cols;
  uint16_t* d = dst + int64_t(blockIdx.x) * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) d[i] = to_bf16(s[i]);
}

__global__ void scatter_add_kernel(const float* src, int64_t cols, const int32_t* rows,
                                   const float* weights, float* dst) {
  const float* s = src + int64_t(blockIdx.x) * cols;
  float* d = dst + int64_t(rows[blockIdx.x]) * cols;
  const float w = weights[blockIdx.x];
  // Rounded product, then the add, as the CPU engine's loop (nvcc would fuse them into an FMA).
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    d[i] = __fadd_rn(d[i], __fmul_rn(w, s[i]));
}

__global__ void argmax_kernel(const float* logits, int64_t cols, int32_t* out) {
  __shared__ float best_v[kThreads];
  __shared__ int64_t best_i[kThreads];
  const float* row = logits + blockIdx.x * cols;
  float v = -INFINITY;
  int64_t idx = -1;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    if (idx < 0 || row[i] > v) {  // strictly greater: the lowest index of a tie stays
      v = row[i];
      idx = i;
    }
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (int(threadIdx.x) < stride) {
      const float ov = best_v[threadIdx.x + stride];
      const int64_t oi = best_i[threadIdx.x + stride];
      const bool take = oi >= 0 && (best_i[threadIdx.x] < 0 || ov > best_v[threadIdx.x] ||
                                    (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x]));
      if (take) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = int32_t(best_i[0]);
}

}  // namespace

void rms_norm(const float* x, float* y, int64_t rows, int64_t dim, const float* weight, float eps,
              cudaStream_t stream) {
  if (rows == 0) return;
  rms_norm_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, y, dim, weight, eps);
  SLUICE_CUDA_CHECK_LAUNCH("rms_norm kernel");
}

void layer_norm(const float* x, float* y, int64_t rows, int64_t dim, const float* weight, float eps,
                cudaStream_t stream) {
  if (rows == 0) return;
  layer_norm_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, y, dim, weight, eps);
  SLUICE_CUDA_CHECK_LAUNCH("layer_norm kernel");
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  add_bias_kernel<<<unsigned(rows), kThreads, 0, stream>>>(y, bias, cols);
  SLUICE_CUDA_CHECK_LAUNCH("add_bias kernel");
}

void clamp(float* x, int64_t n, float limit, cudaStream_t stream) {
  if (n == 0) return;
  clamp_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, limit);
  SLUICE_CUDA_CHECK_LAUNCH("clamp kernel");
}

void sigmoid(float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  sigmoid_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n);
  SLUICE_CUDA_CHECK_LAUNCH("sigmoid kernel");
}

void add_scaled_rows(const float* src, int64_t cols, const float* scales, int64_t n, float* dst,
                     cudaStream_t stream) {
  if (n == 0) return;
  add_scaled_rows_kernel<<<unsigned(n), kThreads, 0, stream>>>(src, cols, scales, dst);
  SLUICE_CUDA_CHECK_LAUNCH("add_scaled_rows kernel");
}

void apply_rope(float* x, int64_t rows, int n_heads, int head_dim, int rotary_dim,
                const int32_t* positions, const float* inv_freq, cudaStream_t stream) {
  if (rows == 0) return;
  if (rotary_dim == 0) rotary_dim = head_dim;
  rope_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, n_heads, head_dim, rotary_dim / 2,
                                                       positions, inv_freq);
  SLUICE_CUDA_CHECK_LAUNCH("rope kernel");
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, out, n);
  SLUICE_CUDA_CHECK_LAUNCH("silu_mul kernel");
}

void route_top_k(const float* logits, int64_t tokens, int n_experts, int top_k, bool renormalize,
                 int32_t* expert_ids, float* weights, cudaStream_t stream) {
  if (tokens == 0) return;
  route_kernel<<<unsigned((tokens + 127) / 128), 128, 0, stream>>>(
      logits, tokens, n_experts, top_k, renormalize, expert_ids, weights);
  SLUICE_CUDA_CHECK_LAUNCH("route_top_k kernel");
}

void route_top_k(const cpu::RoutingArgs& a, cudaStream_t stream) {
  if (a.score == cpu::RouterScoreFn::kSoftmax && !a.selection_bias && a.groups == 1 &&
      a.scale == 1.0f)
    return route_top_k(a.logits, a.tokens, a.n_experts, a.top_k, a.renormalize, a.expert_ids,
                       a.weights, stream);
  if (a.n_experts > kMaxRuleExperts)
    fail(
        "cuda route_top_k: field 'n_experts': expected at most {} with sigmoid scores, a bias, "
        "groups or a scale, got {}",
        kMaxRuleExperts, a.n_experts);
  if (a.tokens == 0) return;
  route_rule_kernel<<<unsigned((a.tokens + 127) / 128), 128, 0, stream>>>(a.logits, a.tokens,
                                                                          a.n_experts, a.top_k, a);
  SLUICE_CUDA_CHECK_LAUNCH("route_top_k rule kernel");
}

void gather_rows_bf16(const float* src, int64_t cols, const int32_t* rows, int64_t n, uint16_t* dst,
                      cudaStream_t stream) {
  if (n == 0) return;
  gather_kernel<<<unsigned(n), kThreads, 0, stream>>>(src, cols, rows, dst);
  SLUICE_CUDA_CHECK_LAUNCH("gather_rows_bf16 kernel");
}

void scatter_add_rows(const float* src, int64_t cols, const int32_t* rows, const float* weights,
                      int64_t n, float* dst, cudaStream_t stream) {
  if (n == 0) return;
  scatter_add_kernel<<<unsigned(n), kThreads, 0, stream>>>(src, cols, rows, weights, dst);
  SLUICE_CUDA_CHECK_LAUNCH("scatter_add_rows kernel");
}

void argmax_rows(const float* logits, int64_t rows, int64_t cols, int32_t* out,
                 cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<unsigned(rows), kThreads, 0, stream>>>(logits, cols, out);
  SLUICE_CUDA_CHECK_LAUNCH("argmax kernel");
}

}  // namespace sluice::cuda
