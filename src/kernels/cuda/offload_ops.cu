#include "kernels/cuda/offload_ops.h"
#include "kernels/cuda/cuda_check.h"

namespace sluice::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__device__ float bf16_value(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}

__device__ uint16_t round_to_bf16(float f) {  // nearest even, as core/dtype.h
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// core/dtype.h's fp8_e4m3_to_f32: 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m · 2^-9), S.1111.111 is NaN (e4m3fn has no infinities).
__device__ float e4m3_value(uint8_t code) {
  const uint32_t magnitude = code & 0x7fu, sign = uint32_t(code & 0x80u) << 24;
  if (magnitude == 0x7fu) return __uint_as_float(0x7fc00000u | sign);
  if (magnitude < 8u)
    return __uint_as_float(__float_as_uint(float(magnitude) * (1.0f / 512.0f)) | sign);
  return __uint_as_float(((magnitude << 20) + (120u << 23)) | sign);
}

// Row blockIdx.y of the panel; the threads stride over its k values.
__global__ void dequantize_fp8_kernel(const uint8_t* q, const float* scale, int64_t k, int64_t row0,
                                      uint16_t* out) {
  const int64_t j = row0 + blockIdx.y, scale_cols = (k + 127) / 128;
  const uint8_t* codes = q + j * k;
  const float* scales = scale + (j / 128) * scale_cols;
  uint16_t* o = out + int64_t(blockIdx.y) * k;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < k;
       p += int64_t(gridDim.x) * blockDim.x)
    o[p] = round_to_bf16(e4m3_value(codes[p]) * scales[p / 128]);
}

// Block (blockIdx.x, blockIdx.y): outputs y[row = blockIdx.y][j] for 8 consecutive j, a warp each.
__global__ void gemm_f32_bf16w_kernel(const float* x, const uint16_t* w, float* y, int64_t n,
                                      int64_t k, float beta, int64_t ldy) {
  const int lane = threadIdx.x % 32;
  const int64_t j = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (j >= n) return;
  const float* xr = x + int64_t(blockIdx.y) * k;
  const uint16_t* wr = w + j * k;
  float acc = 0.0f;
  for (int64_t i = lane; i < k; i += 32) acc += xr[i] * bf16_value(wr[i]);
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) {
    float* out = y + int64_t(blockIdx.y) * ldy + j;
    *out = beta == 0.0f ? acc : acc + beta * *out;
  }
}

__global__ void f32_to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = round_to_bf16(x[i]);
}

__global__ void gather_f32_kernel(const float* src, int64_t cols, const int32_t* rows, float* dst) {
  const float* s = src + int64_t(rows[blockIdx.x]) * cols;
  float* d = dst + int64_t(blockIdx.x) * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) d[i] = s[i];
}

}  // namespace

void gemm_f32_bf16w(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                    float beta, cudaStream_t stream, int64_t ldy) {
  if (m == 0 || n == 0) return;
  if (ldy == 0) ldy = n;
  // gridDim.y is at most 65535: rows go in chunks of that many.
  constexpr int64_t kMaxRows = 65535;
  for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
    const int64_t rows = m - r0 < kMaxRows ? m - r0 : kMaxRows;
    const dim3 grid(unsigned((n + kWarpsPerBlock - 1) / kWarpsPerBlock), unsigned(rows));
    gemm_f32_bf16w_kernel<<<grid, 32 * kWarpsPerBlock, 0, stream>>>(x + r0 * k, w, y + r0 * ldy, n,
                                                                    k, beta, ldy);
    SLUICE_CUDA_CHECK_LAUNCH("gemm_f32_bf16w kernel");
  }
}

void dequantize_fp8(const uint8_t* q, const float* scale, int64_t k, int64_t row0, int64_t rows,
                    uint16_t* out, cudaStream_t stream) {
  if (rows == 0 || k == 0) return;
  // gridDim.y is at most 65535 rows; a panel's rows are far fewer (kFp8TileMaxElements / k).
  constexpr int64_t kMaxRows = 65535;
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int64_t n = rows - r0 < kMaxRows ? rows - r0 : kMaxRows;
    const dim3 grid(unsigned((k + 255) / 256 < 64 ? (k + 255) / 256 : 64), unsigned(n));
    dequantize_fp8_kernel<<<grid, 256, 0, stream>>>(q, scale, k, row0 + r0, out + r0 * k);
    SLUICE_CUDA_CHECK_LAUNCH("dequantize_fp8 kernel");
  }
}

void f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256;
  f32_to_bf16_kernel<<<unsigned(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(x, y, n);
  SLUICE_CUDA_CHECK_LAUNCH("f32_to_bf16 kernel");
}

void gather_rows_f32(const float* src, int64_t cols, const int32_t* rows, int64_t n, float* dst,
                     cudaStream_t stream) {
  if (n == 0) return;
  gather_f32_kernel<<<unsigned(n), 256, 0, stream>>>(src, cols, rows, dst);
  SLUICE_CUDA_CHECK_LAUNCH("gather_rows_f32 kernel");
}

}  // namespace sluice::cuda
