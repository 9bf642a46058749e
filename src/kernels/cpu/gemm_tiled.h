// sluice's own GEMM against bf16 weights used in place (see gemm_tiles.h for the packed layout
// and the tiles): the path of every level where oneDNN has no bf16 matmul (below AVX-512), of
// gemm_f32, and the fallback when a oneDNN primitive cannot be created.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/isa.h"

namespace sluice::cpu {

struct TiledGemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* x = nullptr;  // [m, k] fp32 or bf16, row stride ldx
  DType x_dtype = DType::F32;
  int64_t ldx = 0;
  bool round_x_to_bf16 = true;  // fp32 X rounded to bf16 (nearest even) first, as cpu::gemm does
  const uint16_t* w = nullptr;  // bf16 [n, k], row stride ldw
  int64_t ldw = 0;
  float* y = nullptr;  // fp32 [m, n], row stride ldy
  int64_t ldy = 0;
  float beta = 0.0f;
};

// Shapes and strides already checked by the caller; every stride is explicit (non-zero). Runs on
// the OpenMP pool at `level`'s tiles: scalar, avx2 (also at avx512), and at avx512bf16 and above,
// where X is bf16 or rounded to it (fp32 X keeps the avx2 tiles), the token-lane kernel of
// gemm_lanes.h at every m.
void tiled_gemm(const TiledGemmArgs& args, IsaLevel level);

// Row `row` of X as bf16 in its natural order (fp32 rounded to nearest even), zero-padded to
// `ldp` values: the packing of the token lanes' leftover rows.
void pack_row_bf16(const TiledGemmArgs& a, int64_t row, uint16_t* dst, int64_t ldp);

// "sluice:avx512bf16 lanes", "sluice:avx2" or "sluice:scalar": the kernel tiled_gemm uses at
// `level`, bf16 (or rounded) activations.
const char* tiled_gemm_name(IsaLevel level);

}  // namespace sluice::cpu
