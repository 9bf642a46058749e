// GEMM against float8 e4m3 weights with 128 × 128 block scales, as DeepSeek-V3 and R1 store
// their linear layers:
//
//   Y[m, n] = X[m, k] · Wᵀ + beta · Y,   W[j, p] = bf16(float(q[j, p]) · s[j / 128, p / 128])
//
// q is F8_E4M3 [n, k] (the checkpoint's `<name>.weight`, nn.Linear layout) and s its
// `<name>.weight_scale_inv`, F32 [⌈n/128⌉, ⌈k/128⌉]: the last block row and column may be
// partial (kv_a_proj_with_mqa has 576 rows). This is DeepSeek's `weight_dequant` (an fp32
// product stored to bf16) and transformers' Fp8Dequantize followed by the cast to the model's
// bf16: the fp32 product is rounded once, to nearest even.
//
// The weights stay 1 byte each in memory; the kernel dequantises a panel of W (kPanelRows rows
// by kPanelDepth values) into a per-thread bf16 tile just before the bf16 GEMM tiles
// (gemm_tiled.h) multiply it, so X is treated exactly as cpu::gemm treats it (fp32 rounded to
// bf16, fp32 accumulation). The threads split W's rows by panels.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace sluice::cpu {

constexpr int64_t kFp8Block = 128;  // rows and columns of one scale block

// A matrix in its checkpoint form, used where it lies.
struct Fp8Matrix {
  const uint8_t* q = nullptr;    // [n, k] e4m3 codes, row stride k
  const float* scale = nullptr;  // [⌈n/128⌉, ⌈k/128⌉] weight_scale_inv
  int64_t n = 0, k = 0;

  int64_t scale_cols() const { return (k + kFp8Block - 1) / kFp8Block; }
  int64_t scale_rows() const { return (n + kFp8Block - 1) / kFp8Block; }
  float scale_at(int64_t j, int64_t p) const {
    return scale[(j / kFp8Block) * scale_cols() + p / kFp8Block];
  }
  // Bytes a GEMM reads: the codes and the scales.
  size_t bytes() const { return size_t(n * k) + size_t(scale_rows() * scale_cols()) * 4; }
};

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of W dequantised to bf16 into `out`
// (row stride ldo), at the ISA level in force; bit for bit the scalar form at every level.
void dequantize_fp8(const Fp8Matrix& w, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                    uint16_t* out, int64_t ldo);
void dequantize_fp8_scalar(const Fp8Matrix& w, int64_t row0, int64_t rows, int64_t col0,
                           int64_t cols, uint16_t* out, int64_t ldo);

struct GemmFp8Args {
  int64_t m = 0;
  const void* x = nullptr;     // [m, k], row stride ldx elements
  DType x_dtype = DType::F32;  // F32 or BF16
  int64_t ldx = 0;             // 0 means k
  const Fp8Matrix* w = nullptr;
  float* y = nullptr;  // fp32 [m, n], row stride ldy elements
  int64_t ldy = 0;     // 0 means n
  float beta = 0.0f;   // 0: overwrite Y; otherwise Y = X·Wᵀ + beta·Y
  // fp32 X rounded to bf16 first, as cpu::gemm; false: used as it is, as cpu::gemm_f32 (the
  // engine's --precision f32).
  bool round_x_to_bf16 = true;
};

void gemm_fp8(const GemmFp8Args& args);
// W dequantised whole by the scalar form, then gemm_reference (X rounded to bf16 whatever
// round_x_to_bf16 says). Slow; for tests.
void gemm_fp8_reference(const GemmFp8Args& args);

}  // namespace sluice::cpu
