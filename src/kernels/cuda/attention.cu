// One block per (query row, group of query heads that share a KV head), online softmax over
// chunks of keys. Each key and value is read once per block for all the group's heads (GQA: 4
// query heads per KV head in Mixtral), and read coalesced: a warp scores one key at a time, its
// lanes splitting head_dim, and the threads accumulating the output each own head dims across the
// group's heads. Exact in fp32.
//
// Measured on an H200 (Nsight Compute, Mixtral-8x7B shape, prefill of 4096 rows of 512-token
// prompts): the kernel before this one (a block per row and head, each thread scoring a whole key
// by itself) took 3.1 ms per call of 2048 rows, 75% of the device's time in prefill steps
// (bench/RESULTS.md, GPU offload).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"

namespace sluice::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 64;  // keys scored per round
constexpr int kMaxHeadDim = 256;
constexpr int kMaxDimsPerThread = kMaxHeadDim / kThreads;
constexpr int kMaxGroup = 16;  // query heads per block

__device__ float bf16(uint16_t v) {
  return __uint_as_float(uint32_t(v) << 16);
}

// The block's query heads: `group` consecutive heads h0.. of one KV head.
__global__ void attention_kernel(PagedAttentionArgs a, int group) {
  const int64_t row = blockIdx.x;
  const int h0 = int(blockIdx.y) * group, kvh = h0 / (a.heads / a.kv_heads);
  const int hd = a.head_dim, lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int pos = a.row_pos[row];
  const int first = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  const int32_t* table = a.tables + a.row_table[row];
  const int64_t tile = int64_t(a.block_size) * hd;
  const int64_t block_elems = 2 * int64_t(a.kv_heads) * tile;
  auto key = [&](int p) {
    return a.kv + int64_t(table[p / a.block_size]) * block_elems + kvh * tile +
           int64_t(p % a.block_size) * hd;
  };

  __shared__ float q[kMaxGroup * kMaxHeadDim];
  __shared__ float weight[kMaxGroup * kChunk];  // scores, then their exponentials
  __shared__ float running_max[kMaxGroup], running_sum[kMaxGroup], rescale[kMaxGroup];
  const float* qr = a.q + (row * a.heads + h0) * hd;
  for (int i = int(threadIdx.x); i < group * hd; i += kThreads) q[i] = qr[i];
  if (int(threadIdx.x) < group) {
    running_max[threadIdx.x] = -INFINITY;
    running_sum[threadIdx.x] = 0;
  }
  __syncthreads();

  float acc[kMaxGroup][kMaxDimsPerThread] = {};  // dims threadIdx.x + t · kThreads, every head
  for (int start = first; start <= pos; start += kChunk) {
    const int n = min(kChunk, pos - start + 1);
    // Scores: warp w takes keys w, w + 4, ...; lane l holds dims l, l + 32, ... of the key.
    for (int j = warp; j < n; j += kWarps) {
      const uint16_t* k = key(start + j);
      float kd[kMaxHeadDim / 32];
#pragma unroll
      for (int t = 0; t < kMaxHeadDim / 32; ++t) {
        const int d = lane + 32 * t;
        kd[t] = d < hd ? bf16(k[d]) : 0.0f;
      }
      for (int g = 0; g < group; ++g) {
        float dot = 0;
#pragma unroll
        for (int t = 0; t < kMaxHeadDim / 32; ++t) {
          const int d = lane + 32 * t;
          if (d < hd) dot += q[g * hd + d] * kd[t];
        }
        for (int offset = 16; offset > 0; offset /= 2)
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        if (lane == 0) weight[g * kChunk + j] = dot * a.scale;
      }
    }
    __syncthreads();
    // The online softmax of each head over the chunk, one thread per head.
    if (int(threadIdx.x) < group) {
      float* w = weight + threadIdx.x * kChunk;
      float m = running_max[threadIdx.x];
      for (int j = 0; j < n; ++j) m = fmaxf(m, w[j]);
      float sum = 0;
      for (int j = 0; j < n; ++j) {
        w[j] = expf(w[j] - m);
        sum += w[j];
      }
      const float r = expf(running_max[threadIdx.x] - m);  // 0 on the first chunk
      running_sum[threadIdx.x] = running_sum[threadIdx.x] * r + sum;
      running_max[threadIdx.x] = m;
      rescale[threadIdx.x] = r;
    }
    __syncthreads();
    // Values: each thread its dims of every head of the group.
#pragma unroll
    for (int t = 0; t < kMaxDimsPerThread; ++t) {
      const int d = int(threadIdx.x) + t * kThreads;
      if (d >= hd) break;
        // The head loops run to the constant kMaxGroup so that acc stays in registers.
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < group) acc[g][t] *= rescale[g];
      for (int j = 0; j < n; ++j) {
        const float v = bf16(key(start + j)[a.kv_heads * tile + d]);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g)
          if (g < group) acc[g][t] += weight[g * kChunk + j] * v;
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    float* out = a.out + (row * a.heads + h0 + g) * hd;
#pragma unroll
    for (int t = 0; t < kMaxDimsPerThread; ++t) {
      const int d = int(threadIdx.x) + t * kThreads;
      if (d < hd) out[d] = running_sum[g] > 0 ? acc[g][t] / running_sum[g] : 0.0f;
    }
  }
}

__device__ uint16_t to_bf16(float f) {  // round to nearest even; NaN kept
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// One block per written row: its K and V, every head.
__global__ void write_kv_kernel(uint16_t* kv, int kv_heads, int head_dim, int block_size,
                                const float* k, const float* v, const int32_t* rows,
                                const int32_t* slots) {
  const int64_t j = blockIdx.x, width = int64_t(kv_heads) * head_dim;
  const int64_t tile = int64_t(block_size) * head_dim;
  const int64_t block = slots[j] / block_size, slot = slots[j] % block_size;
  const float* kr = k + int64_t(rows[j]) * width;
  const float* vr = v + int64_t(rows[j]) * width;
  uint16_t* base = kv + block * 2 * kv_heads * tile + slot * head_dim;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const int64_t h = i / head_dim, d = i % head_dim;
    base[h * tile + d] = to_bf16(kr[i]);
    base[(kv_heads + h) * tile + d] = to_bf16(vr[i]);
  }
}

}  // namespace

void write_kv(uint16_t* kv, int kv_heads, int head_dim, int block_size, const float* k,
              const float* v, const int32_t* rows, const int32_t* slots, int64_t n,
              cudaStream_t stream) {
  if (n == 0) return;
  write_kv_kernel<<<unsigned(n), 128, 0, stream>>>(kv, kv_heads, head_dim, block_size, k, v, rows,
                                                   slots);
  SLUICE_CUDA_CHECK_LAUNCH("write_kv kernel");
}

void paged_attention(const PagedAttentionArgs& args, cudaStream_t stream) {
  PagedAttentionArgs a = args;
  if (a.rows == 0) return;
  if (a.head_dim <= 0 || a.head_dim > kMaxHeadDim || a.kv_heads <= 0 || a.heads % a.kv_heads != 0)
    fail(
        "cuda paged_attention: field 'shape': expected head_dim in (0, {}] and heads a multiple "
        "of kv_heads, got head_dim={} heads={} kv_heads={}",
        kMaxHeadDim, a.head_dim, a.heads, a.kv_heads);
  if (a.scale == 0.0f) a.scale = 1.0f / std::sqrt(float(a.head_dim));
  // Query heads per block: the largest divisor of the GQA group that fits the block's arrays.
  const int per_kv_head = a.heads / a.kv_heads;
  int group = std::min(per_kv_head, kMaxGroup);
  while (per_kv_head % group != 0) --group;
  const dim3 grid(unsigned(a.rows), unsigned(a.heads / group));
  attention_kernel<<<grid, kThreads, 0, stream>>>(a, group);
  SLUICE_CUDA_CHECK_LAUNCH("paged_attention kernel");
}

}  // namespace sluice::cuda
