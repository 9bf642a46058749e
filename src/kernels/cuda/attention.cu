// One block per (query row, head), online softmax over chunks of keys: each thread scores one
// key of the chunk (a head_dim dot product), the block takes the chunk's max and sum, then each
// thread accumulates its head dims over the chunk's values. Simple and exact in fp32; decode
// attention is bandwidth-bound on the KV reads, which every key is read for once per head.
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"

namespace sluice::cuda {
namespace {

constexpr int kChunk = 128;  // keys per chunk = threads per block
constexpr int kMaxHeadDim = 256;

__device__ float bf16(uint16_t v) {
  return __uint_as_float(uint32_t(v) << 16);
}

__global__ void attention_kernel(PagedAttentionArgs a) {
  const int64_t row = blockIdx.x;
  const int h = blockIdx.y, kvh = h / (a.heads / a.kv_heads);
  const int pos = a.row_pos[row];
  const int first = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  const int32_t* table = a.tables + a.row_table[row];
  const int64_t tile = int64_t(a.block_size) * a.head_dim;
  const int64_t block_elems = 2 * int64_t(a.kv_heads) * tile;

  __shared__ float q[kMaxHeadDim], weight[kChunk], reduce[kChunk];
  const float* qr = a.q + (row * a.heads + h) * a.head_dim;
  for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) q[d] = qr[d];
  __syncthreads();

  float running_max = -INFINITY, running_sum = 0;
  float acc[kMaxHeadDim / kChunk] = {};  // dims threadIdx.x, threadIdx.x + kChunk
  for (int start = first; start <= pos; start += kChunk) {
    const int p = start + int(threadIdx.x);
    float score = -INFINITY;
    if (p <= pos) {
      const uint16_t* k = a.kv + int64_t(table[p / a.block_size]) * block_elems + kvh * tile +
                          int64_t(p % a.block_size) * a.head_dim;
      float dot = 0;
      for (int d = 0; d < a.head_dim; ++d) dot += q[d] * bf16(k[d]);
      score = dot * a.scale;
    }
    reduce[threadIdx.x] = score;
    __syncthreads();
    for (int s = kChunk / 2; s > 0; s /= 2) {
      if (int(threadIdx.x) < s)
        reduce[threadIdx.x] = fmaxf(reduce[threadIdx.x], reduce[threadIdx.x + s]);
      __syncthreads();
    }
    const float new_max = fmaxf(running_max, reduce[0]);
    __syncthreads();
    const float w = p <= pos ? expf(score - new_max) : 0.0f;
    weight[threadIdx.x] = w;
    reduce[threadIdx.x] = w;
    __syncthreads();
    for (int s = kChunk / 2; s > 0; s /= 2) {
      if (int(threadIdx.x) < s) reduce[threadIdx.x] += reduce[threadIdx.x + s];
      __syncthreads();
    }
    const float rescale = expf(running_max - new_max);  // 0 on the first chunk
    running_sum = running_sum * rescale + reduce[0];
    running_max = new_max;
    const int n = min(kChunk, pos - start + 1);
    for (int j = 0; j < kMaxHeadDim / kChunk; ++j) {
      const int d = int(threadIdx.x) + j * kChunk;
      if (d >= a.head_dim) break;
      float sum = acc[j] * rescale;
      for (int i = 0; i < n; ++i) {
        const int pp = start + i;
        const uint16_t* v = a.kv + int64_t(table[pp / a.block_size]) * block_elems +
                            (a.kv_heads + kvh) * tile + int64_t(pp % a.block_size) * a.head_dim;
        sum += weight[i] * bf16(v[d]);
      }
      acc[j] = sum;
    }
    __syncthreads();
  }
  float* out = a.out + (row * a.heads + h) * a.head_dim;
  for (int j = 0; j < kMaxHeadDim / kChunk; ++j) {
    const int d = int(threadIdx.x) + j * kChunk;
    if (d < a.head_dim) out[d] = running_sum > 0 ? acc[j] / running_sum : 0.0f;
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
  const dim3 grid(unsigned(a.rows), unsigned(a.heads));
  attention_kernel<<<grid, kChunk, 0, stream>>>(a);
  SLUICE_CUDA_CHECK_LAUNCH("paged_attention kernel");
}

}  // namespace sluice::cuda
