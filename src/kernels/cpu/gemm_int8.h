// GEMM against int8 weights with group-wise scales, for the quantized experts:
//
//   Y[m, n] = X[m, k] · Wᵀ + beta · Y       (torch: y = F.linear(x, dequant(w)) + beta * y)
//
// Weights: int8 [n, k] (nn.Linear layout) in [-127, 127] with one fp32 scale per row and group
// of `group_size` consecutive k (symmetric: w ≈ scale · q, scale = max|w| / 127 over the group).
// fp32 scales rather than bf16: at group 128 they add 3% to the weight bytes, and they keep the
// quantization error that of the int8 values alone.
//
// Activations: quantized on the fly per row and per group of the same size, symmetrically and
// exactly as the weights are (x ≈ sx · qx, sx = max|x| / 127, qx = round-to-nearest-even).
// A group of X or W holding an inf or NaN gets scale NaN: the outputs it feeds are NaN.
//
// Arithmetic, the same at every ISA level bit for bit: for each (i, j) and group g in increasing
// order, the int32 dot product d = Σ qx·qw over the group is exact (|d| ≤ 1024·127² < 2²⁴, so
// float(d) is exact too), and
//     acc = fma(float(d), sx[i,g] · sw[j,g], acc)        (acc starts at 0; one fp32 product)
//     y   = beta == 0 ? acc : fma(beta, y, acc)
// Every level performs these very operations, so the vector kernels differ from the scalar
// reference in nothing but speed. The fma is spelled out everywhere (std::fma in plain C++):
// GCC contracts a·b + c into vfmadd inside FMA-target functions (-ffp-contract=fast) but cannot
// in the x86-64-v2 scalar code, so a written-out multiply-add would round differently per level.
//
// The packed layout, built once at load: rows in blocks of 16 (the last block padded with zero
// rows of scale 0), and within a block the k axis in quads of 4 bytes, row by row:
//     packed[block][k / 4][16 rows][4]        scales[block][k / group_size][16 rows]
// A 64-byte line then holds 4 k of each of the 16 rows, the operand of one AVX512-VNNI vpdpbusd
// (or two AVX2 vpmaddubsw) whose int32 lanes are 16 rows' partial sums: no horizontal reduction.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {

constexpr int64_t kInt8BlockRows = 16;   // rows of W per packed block
constexpr int64_t kInt8MaxGroup = 1024;  // keeps a group's int32 sum exact in fp32

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

struct Int8Weights {
  int64_t n = 0, k = 0, group_size = 0;
  std::unique_ptr<int8_t[], FreeDeleter> packed;  // 64-byte aligned, layout above
  std::unique_ptr<float[], FreeDeleter> scales;   // 64-byte aligned, layout above

  int64_t blocks() const { return (n + kInt8BlockRows - 1) / kInt8BlockRows; }
  int64_t groups() const { return k / group_size; }
  // The quantized weight of row j, column p, and the scale of row j, group g (unpacked view).
  int8_t q(int64_t j, int64_t p) const;
  float scale(int64_t j, int64_t g) const;
  // Bytes a GEMM reads from W: the int8 values and the scales, padding included.
  size_t bytes() const;
  Int8Weights clone() const;  // a deep copy (benchmarks keep several to defeat the cache)
};

// Quantizes bf16 W [n, k] (row stride k) group-wise: scale = max|w| / 127 (0 for an all-zero
// group), q = round-to-nearest-even(w · (127 / max|w|)). Fails, naming the field, when k is
// not a multiple of group_size or group_size is not a multiple of 4 in [4, 1024].
Int8Weights quantize_weights_int8(const uint16_t* w, int64_t n, int64_t k, int64_t group_size);

// Packs already-quantized weights: q int8 [n, k] in [-127, 127] and scales fp32 [n, k / group].
// (A quantized checkpoint loads through this without a bf16 pass.) -128 is rejected: the AVX2
// kernel negates weights.
Int8Weights pack_weights_int8(const int8_t* q, const float* scales, int64_t n, int64_t k,
                              int64_t group_size);

struct GemmInt8Args {
  int64_t m = 0;
  const void* x = nullptr;     // [m, k], row stride ldx elements
  DType x_dtype = DType::F32;  // F32 or BF16
  int64_t ldx = 0;             // 0 means k
  const Int8Weights* w = nullptr;
  float* y = nullptr;  // fp32 [m, n], row stride ldy elements
  int64_t ldy = 0;     // 0 means n
  float beta = 0.0f;   // 0: overwrite Y; otherwise Y = X·Wᵀ + beta·Y
};

// Parallel over blocks of 16 output columns (OpenMP), with the instruction gemm_int8_dot().
void gemm_int8(const GemmInt8Args& args);
// Plain loops over (i, j, group) reading the unpacked view of W; sequential, for tests.
void gemm_int8_reference(const GemmInt8Args& args);

// The int8 dot-product instruction gemm_int8 uses at the current level: int8_dot(), except at
// the amx level, which runs the AVX512-VNNI kernel (AMX-INT8 tiles are not written yet).
Int8Dot gemm_int8_dot();
// Every instruction gemm_int8_using accepts at the current level: scalar, vpmaddubsw from avx2
// on, AVX-VNNI and AVX512-VNNI where the CPU has them. An AVX-VNNI machine's avx2 level uses
// vpdpbusd, so this is how its tests and benchmarks also reach the vpmaddubsw kernel.
std::vector<Int8Dot> gemm_int8_dots_available();
// gemm_int8 with a chosen instruction, one of gemm_int8_dots_available() (else an error).
void gemm_int8_using(Int8Dot dot, const GemmInt8Args& args);

}  // namespace sluice::cpu
