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
// int4 weights (QuantFormat::kInt4) run through the same int8 dot products: each weight is
// q in [-7, 7] with scale = max|w| / 7, stored as the nibble u = q + 8 in [1, 15]. A kernel
// unpacks a 64-byte line of nibbles into two int8 lines in registers (u & 15, u >> 4) and uses
// u as the unsigned operand of vpdpbusd / vpmaddubsw, starting the group's int32 sum at -8·Σqx:
// Σ u·qx − 8·Σqx = Σ q·qx, exact. So the arithmetic above holds for int4 unchanged.
//
// The packed layout, built once at load, in one 64-byte aligned buffer (QuantView::data): rows
// in blocks of 16 (the last block padded with zero rows of scale 0), and within a block the k
// axis in quads of 4 bytes, row by row:
//     int8:  values[block][k / 4][16 rows][4]
//     int4:  values[block][k / 8][16 rows][4]: byte b of a row's 4 holds u(k = 8o + b) in its
//            low nibble and u(8o + 4 + b) in its high nibble (o the octet of k)
// then, at the next multiple of 64 bytes,
//     scales[block][k / group_size][16 rows]  fp32
// A 64-byte line of int8 values then holds 4 k of each of the 16 rows, the operand of one
// AVX512-VNNI vpdpbusd (or two AVX2 vpmaddubsw) whose int32 lanes are 16 rows' partial sums:
// no horizontal reduction. A 64-byte line of int4 values holds two such operands.
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

enum class QuantFormat : uint8_t { kInt8, kInt4 };
const char* quant_format_name(QuantFormat f);  // "int8", "int4"
int quant_max(QuantFormat f);                  // the largest |q|: 127 or 7
// k of each row a group size must be a multiple of: 4 (one int8 quad) or 8 (one int4 octet).
int64_t quant_group_multiple(QuantFormat f);

// Bytes of a packed matrix (values, padding and scales, layout above; a multiple of 64).
size_t quant_bytes(QuantFormat f, int64_t n, int64_t k, int64_t group_size);
// Fails, naming `what` and the field, when n <= 0, group_size is not a multiple of
// quant_group_multiple(f) in [4, 1024], or k is not a positive multiple of group_size.
void check_quant_shape(const char* what, QuantFormat f, int64_t n, int64_t k, int64_t group_size);

// A packed matrix in memory someone else owns (a stacked expert tensor, a device page).
struct QuantView {
  QuantFormat format = QuantFormat::kInt8;
  int64_t n = 0, k = 0, group_size = 0;
  const uint8_t* data = nullptr;  // 64-byte aligned, quant_bytes(format, n, k, group_size)

  int64_t blocks() const { return (n + kInt8BlockRows - 1) / kInt8BlockRows; }
  int64_t groups() const { return k / group_size; }
  size_t values_bytes() const;  // of the values, before the scales
  const uint8_t* values() const { return data; }
  const float* scales() const { return reinterpret_cast<const float*>(data + values_bytes()); }
  // The quantized weight of row j, column p, and the scale of row j, group g (unpacked view).
  int8_t q(int64_t j, int64_t p) const;
  float scale(int64_t j, int64_t g) const;
  // Bytes a GEMM reads from W: the values and the scales, padding included.
  size_t bytes() const { return quant_bytes(format, n, k, group_size); }
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// A packed matrix owning its buffer.
struct QuantWeights : QuantView {
  std::unique_ptr<uint8_t[], FreeDeleter> storage;
  QuantWeights clone() const;  // a deep copy (benchmarks keep several to defeat the cache)
};

// Quantizes bf16 W [n, k] (row stride k) group-wise into plain row-major form: q [n, k] and
// scales [n, k / group_size], scale = max|w| / quant_max (0 for an all-zero group),
// q = round-to-nearest-even(w · (quant_max / max|w|)). A group holding an inf or NaN gets q = 0
// and scale NaN. This is the form a quantized checkpoint stores (int4 as nibbles, see
// int4_to_nibbles), and pack_weights_into turns it into the kernel's.
void quantize_rows(QuantFormat f, const uint16_t* w, int64_t n, int64_t k, int64_t group_size,
                   int8_t* q, float* scales);
// Packs plain q [n, k] and scales [n, k / group_size] into `out` (quant_bytes of them, 64-byte
// aligned), every byte written. Fails naming field 'q' for a value outside [-quant_max,
// quant_max] (-128 would break the AVX2 kernel's negation; -8 has no int4 nibble). `parallel`:
// over OpenMP's threads (a loader on the main thread); false on threads of one's own, one per
// core (the disk tier's makers), which would otherwise each start a team.
void pack_weights_into(QuantFormat f, const int8_t* q, const float* scales, int64_t n, int64_t k,
                       int64_t group_size, uint8_t* out, bool parallel);
// quantize_rows then pack_weights_into, into `out` or a new buffer.
void quantize_weights_into(QuantFormat f, const uint16_t* w, int64_t n, int64_t k,
                           int64_t group_size, uint8_t* out);
QuantWeights quantize_weights(QuantFormat f, const uint16_t* w, int64_t n, int64_t k,
                              int64_t group_size);
QuantWeights pack_weights(QuantFormat f, const int8_t* q, const float* scales, int64_t n, int64_t k,
                          int64_t group_size);
// The int8 forms, kept for the int8-only callers.
QuantWeights quantize_weights_int8(const uint16_t* w, int64_t n, int64_t k, int64_t group_size);
QuantWeights pack_weights_int8(const int8_t* q, const float* scales, int64_t n, int64_t k,
                               int64_t group_size);

// The checkpoint form of int4 values: two per byte, element 2i in the low nibble and 2i + 1 in
// the high one, each as q + 8 (count even). nibbles_to_int4 fails naming `what` for a nibble 0
// (q = -8, outside the symmetric range).
void int4_to_nibbles(const int8_t* q, int64_t count, uint8_t* out);
void nibbles_to_int4(const uint8_t* nibbles, int64_t count, int8_t* q, const char* what);

struct GemmInt8Args {
  int64_t m = 0;
  const void* x = nullptr;       // [m, k], row stride ldx elements
  DType x_dtype = DType::F32;    // F32 or BF16
  int64_t ldx = 0;               // 0 means k
  const QuantView* w = nullptr;  // int8 or int4
  float* y = nullptr;            // fp32 [m, n], row stride ldy elements
  int64_t ldy = 0;               // 0 means n
  float beta = 0.0f;             // 0: overwrite Y; otherwise Y = X·Wᵀ + beta·Y
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
