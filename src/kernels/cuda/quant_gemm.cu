// The quantized expert GEMM of quant_gemm.h.
//
// A block of 256 threads computes 32 rows of X against 128 rows of W (eight packed blocks of 16),
// group by group, in increasing order: first the block quantizes its 32 rows of X over the group
// into shared memory (8 threads per row: the row's max |x|, then q = rne(x · 127 / max|x|),
// exactly as cpu::quant::quantize_group), then each thread takes two W rows (j and j + 64) and
// 8 rows of X, reads W's 4-byte quads of its rows (16 rows' quads lie side by side in the packed
// layout, so a warp's reads are coalesced), and sums `__dp4a` products into exact int32 dot
// products, which it folds into its fp32 sums with the group's two scales as the CPU does. Where
// the group is a multiple of 16, X's quads come out of shared memory 4 at a time (one 16-byte
// read per row serves 8 `__dp4a`). int4 quads are unpacked in registers: the low nibbles of a
// row's 4 bytes are the octet's first 4 values, the high ones the last 4, each u = q + 8.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/quant_gemm.h"

namespace sluice::cuda {
namespace {

constexpr int kPackedRows = 16;  // W rows per packed block (cpu::kInt8BlockRows)
constexpr int kTileN = 128;      // W rows (output columns) per thread block
constexpr int kCols = 2;         // W rows per thread: j and j + kTileN / kCols
constexpr int kTileM = 32;       // X rows per thread block
constexpr int kThreads = 256;
constexpr int kColThreads = kTileN / kCols;        // 64 threads across W's rows
constexpr int kRowSets = kThreads / kColThreads;   // 4: a thread's X rows are set + 4·r
constexpr int kRowsPerThread = kTileM / kRowSets;  // 8
constexpr int kQuantizers = kThreads / kTileM;     // 8 threads quantize one row of X
constexpr float kXMax = 127.0f;                    // activations are int8 in [-127, 127]

__device__ float x_value(const QuantGemmArgs& a, int64_t i, int64_t p) {
  return a.x_bf16
             ? __uint_as_float(uint32_t(static_cast<const uint16_t*>(a.x)[i * a.ldx + p]) << 16)
             : static_cast<const float*>(a.x)[i * a.ldx + p];
}

// Rows [i0, i0 + kTileM) of X over group g into q (kTileM rows of `group` int8) and their scales
// into sx; rows past m quantize to zeros of scale 0.
__device__ void quantize_x(const QuantGemmArgs& a, int64_t i0, int64_t g, int8_t* q, float* sx) {
  const int row = threadIdx.x / kQuantizers, part = threadIdx.x % kQuantizers;
  const int64_t i = i0 + row, p0 = g * a.group;
  float amax = 0.0f;
  int finite = 1;
  if (i < a.m) {
    for (int64_t p = part; p < a.group; p += kQuantizers) {
      const float v = x_value(a, i, p0 + p);
      amax = fmaxf(amax, fabsf(v));
      finite &= isfinite(v) ? 1 : 0;
    }
  }
  // The row's 8 quantizers are 8 consecutive lanes of one warp.
  for (int o = 1; o < kQuantizers; o *= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    finite &= __shfl_xor_sync(0xffffffffu, finite, o);
  }
  const float inv = amax > 0.0f ? __fdiv_rn(kXMax, amax) : 0.0f;
  for (int64_t p = part; p < a.group; p += kQuantizers) {
    const float v = i < a.m ? x_value(a, i, p0 + p) : 0.0f;
    q[row * a.group + p] = finite ? int8_t(__float2int_rn(__fmul_rn(v, inv))) : int8_t(0);
  }
  if (part == 0) sx[row] = finite ? __fdiv_rn(amax, kXMax) : __int_as_float(0x7fc00000);
}

// One W row of a thread: where its quads (int8) or octets (int4) lie, and its group's scale.
struct WRow {
  const int32_t* quads = nullptr;  // the row's first quad or octet; null past the last block
  const float* scales = nullptr;   // the row's scale of group 0
  int64_t j = 0;
};

__device__ WRow w_row(const QuantGemmArgs& a, int64_t j, bool int4) {
  const int64_t block = j / kPackedRows, lane = j % kPackedRows;
  if (block >= (a.n + kPackedRows - 1) / kPackedRows) return {nullptr, nullptr, j};
  // Row j's quad (int8) or octet (int4) o lies at int32 index (block · per_block + o) · 16 +
  // lane; rows past n read the zero padding of their block.
  const int64_t per_block = int4 ? a.k / 8 : a.k / 4;
  return {reinterpret_cast<const int32_t*>(a.values) + block * per_block * kPackedRows + lane,
          a.scales + block * (a.k / a.group) * kPackedRows + lane, j};
}

// W's quad (or octet) o of the row, 0 past the last block.
__device__ int w_at(const WRow& w, int64_t o) {
  return w.quads ? w.quads[o * kPackedRows] : 0;
}

// An int4 octet's two quads of q = u − 8: the low nibbles, then the high ones.
__device__ int2 unpack_octet(int u) {
  const uint32_t v = uint32_t(u);
  return {int(__vsub4(v & 0x0f0f0f0fu, 0x08080808u)),
          int(__vsub4((v >> 4) & 0x0f0f0f0fu, 0x08080808u))};
}

// The int32 dot products of group g: d[r][c] += X row (set + 4r) · W row c, quad by quad.
// kVec: 4 quads of X per shared-memory read (the group a multiple of 16).
template <bool kInt4, bool kVec>
__device__ void group_dots(const int32_t* xq, int quads, int set, const WRow (&w)[kCols], int64_t g,
                           int (&d)[kRowsPerThread][kCols]) {
  constexpr int kStep = kVec ? 4 : (kInt4 ? 2 : 1);           // quads of X per step
  const int64_t first = kInt4 ? g * (quads / 2) : g * quads;  // the group's first quad or octet
  for (int o = 0; o < quads; o += kStep) {
    int wq[kCols][kStep];  // the step's quads of each W row, unpacked
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      if constexpr (kInt4) {
#pragma unroll
        for (int u = 0; u < kStep / 2; ++u) {
          const int2 q = unpack_octet(w_at(w[c], first + o / 2 + u));
          wq[c][2 * u] = q.x;
          wq[c][2 * u + 1] = q.y;
        }
      } else {
#pragma unroll
        for (int u = 0; u < kStep; ++u) wq[c][u] = w_at(w[c], first + o + u);
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int32_t* xr = xq + (set + kRowSets * r) * quads + o;
      int xv[kStep];
      if constexpr (kVec) {
        const int4 v = *reinterpret_cast<const int4*>(xr);
        xv[0] = v.x, xv[1] = v.y, xv[2] = v.z, xv[3] = v.w;
      } else {
#pragma unroll
        for (int u = 0; u < kStep; ++u) xv[u] = xr[u];
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int u = 0; u < kStep; ++u) d[r][c] = __dp4a(xv[u], wq[c][u], d[r][c]);
    }
  }
}

template <bool kInt4, bool kVec>
__global__ void __launch_bounds__(kThreads) quant_gemm_kernel(QuantGemmArgs a) {
  extern __shared__ int4 shared[];  // X's quads [kTileM][group / 4], then its scales
  const int quads = int(a.group / 4);
  int32_t* xq = reinterpret_cast<int32_t*>(shared);
  float* sx = reinterpret_cast<float*>(xq + kTileM * quads);

  const int64_t i0 = int64_t(blockIdx.y) * kTileM;
  const int set = threadIdx.x / kColThreads;
  const int64_t j0 = int64_t(blockIdx.x) * kTileN + threadIdx.x % kColThreads;
  WRow w[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) w[c] = w_row(a, j0 + c * kColThreads, kInt4);
  float acc[kRowsPerThread][kCols] = {};
  const int64_t groups = a.k / a.group;
  for (int64_t g = 0; g < groups; ++g) {
    quantize_x(a, i0, g, reinterpret_cast<int8_t*>(xq), sx);
    __syncthreads();
    int d[kRowsPerThread][kCols] = {};
    group_dots<kInt4, kVec>(xq, quads, set, w, g, d);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float sw = w[c].scales ? w[c].scales[g * kPackedRows] : 0.0f;
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
        acc[r][c] =
            __fmaf_rn(__int2float_rn(d[r][c]), __fmul_rn(sx[set + kRowSets * r], sw), acc[r][c]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    if (w[c].j >= a.n) continue;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int64_t i = i0 + set + kRowSets * r;
      if (i >= a.m) continue;
      float* y = a.y + i * a.ldy + w[c].j;
      *y = a.beta == 0.0f ? acc[r][c] : __fmaf_rn(a.beta, *y, acc[r][c]);
    }
  }
}

template <bool kInt4>
void launch(const QuantGemmArgs& a, dim3 grid, size_t shared, cudaStream_t stream) {
  if (a.group % 16 == 0) {
    quant_gemm_kernel<kInt4, true><<<grid, kThreads, shared, stream>>>(a);
  } else {
    quant_gemm_kernel<kInt4, false><<<grid, kThreads, shared, stream>>>(a);
  }
}

}  // namespace

void gemm_quant(const QuantGemmArgs& a, cudaStream_t stream) {
  if (a.m == 0 || a.n == 0) return;
  QuantGemmArgs args = a;
  if (args.ldx == 0) args.ldx = a.k;
  if (args.ldy == 0) args.ldy = a.n;
  const size_t shared = size_t(kTileM) * size_t(a.group) + kTileM * sizeof(float);
  // gridDim.y is at most 65535 tiles of 32 rows: 2M rows, far above any expert batch.
  const dim3 grid(unsigned((a.n + kTileN - 1) / kTileN), unsigned((a.m + kTileM - 1) / kTileM));
  if (a.int4) {
    launch<true>(args, grid, shared, stream);
  } else {
    launch<false>(args, grid, shared, stream);
  }
  SLUICE_CUDA_CHECK_LAUNCH("quantized expert GEMM kernel");
}

}  // namespace sluice::cuda
