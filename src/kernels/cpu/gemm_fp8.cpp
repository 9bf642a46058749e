#include "kernels/cpu/gemm_fp8.h"

#include <immintrin.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_tiled.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"

namespace sluice::cpu {
namespace {

// A panel of W dequantised at once: 64 × 1024 bf16 = 128 KB, within L2 beside the tiles' own
// working set, and 64 rows give two threads enough panels to share even W of 576 rows.
constexpr int64_t kPanelRows = 64;
constexpr int64_t kPanelDepth = 1024;  // a multiple of kFp8Block: a panel meets whole blocks

// Eight e4m3 codes (the low bytes of `codes`' lanes, zero-extended) → eight fp32, exactly as
// fp8_e4m3_to_f32: normals by moving the exponent and mantissa into place and rebiasing the
// exponent (7 → 127), subnormals (exponent 0) as m · 2^-9, S.1111.111 as NaN.
SLUICE_AVX2 inline __m256 e4m3_to_f32(__m256i codes) {
  const __m256i magnitude = _mm256_and_si256(codes, _mm256_set1_epi32(0x7f));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(0x80)), 24);
  const __m256i normal =
      _mm256_add_epi32(_mm256_slli_epi32(magnitude, 20), _mm256_set1_epi32(120 << 23));
  const __m256i subnormal = _mm256_castps_si256(
      _mm256_mul_ps(_mm256_cvtepi32_ps(magnitude), _mm256_set1_ps(1.0f / 512.0f)));
  __m256i bits =
      _mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(8), magnitude));
  bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000),
                            _mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7f)));
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

// `count` codes of one row sharing the scale s, to bf16: bf16(float(q) · s).
SLUICE_AVX2 void dequantize_run_avx2(const uint8_t* q, float s, int64_t count, uint16_t* out) {
  const __m256 scale = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i));
    const __m256 lo = _mm256_mul_ps(e4m3_to_f32(_mm256_cvtepu8_epi32(codes)), scale);
    const __m256 hi =
        _mm256_mul_ps(e4m3_to_f32(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))), scale);
    // As convert.cpp: packus within 128-bit lanes, the permute restores the order.
    const __m256i packed = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(avx2::round_to_bf16(lo), avx2::round_to_bf16(hi)), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  for (; i < count; ++i) out[i] = f32_to_bf16(fp8_e4m3_to_f32(q[i]) * s);
}

void dequantize_run_scalar(const uint8_t* q, float s, int64_t count, uint16_t* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = f32_to_bf16(fp8_e4m3_to_f32(q[i]) * s);
}

using RunFn = void (*)(const uint8_t*, float, int64_t, uint16_t*);

void dequantize_with(RunFn run, const Fp8Matrix& w, int64_t row0, int64_t rows, int64_t col0,
                     int64_t cols, uint16_t* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t j = row0 + r;
    for (int64_t p = col0; p < col0 + cols;) {
      const int64_t block_end = std::min({(p / kFp8Block + 1) * kFp8Block, col0 + cols, w.k});
      run(w.q + j * w.k + p, w.scale_at(j, p), block_end - p, out + r * ldo + (p - col0));
      p = block_end;
    }
  }
}

void check(const GemmFp8Args& a) {
  if (!a.w || !a.w->q || !a.w->scale || a.w->n <= 0 || a.w->k <= 0)
    fail("gemm_fp8: field 'w': expected codes, scales and n, k > 0");
  if (a.m < 0) fail("gemm_fp8: field 'm': expected m >= 0, got {}", a.m);
  if (a.x_dtype != DType::F32 && a.x_dtype != DType::BF16)
    fail("gemm_fp8: field 'x_dtype': expected F32 or BF16, got {}", dtype_name(a.x_dtype));
}

uint16_t* panel_scratch() {
  thread_local std::vector<uint16_t> panel(size_t(kPanelRows * kPanelDepth));
  return panel.data();
}

}  // namespace

void dequantize_fp8_scalar(const Fp8Matrix& w, int64_t row0, int64_t rows, int64_t col0,
                           int64_t cols, uint16_t* out, int64_t ldo) {
  dequantize_with(dequantize_run_scalar, w, row0, rows, col0, cols, out, ldo);
}

void dequantize_fp8(const Fp8Matrix& w, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                    uint16_t* out, int64_t ldo) {
  dequantize_with(isa_at_least(IsaLevel::kAvx2) ? dequantize_run_avx2 : dequantize_run_scalar, w,
                  row0, rows, col0, cols, out, ldo);
}

void gemm_fp8(const GemmFp8Args& args) {
  check(args);
  if (args.m == 0) return;
  const Fp8Matrix& w = *args.w;
  const int64_t ldx = args.ldx ? args.ldx : w.k, ldy = args.ldy ? args.ldy : w.n;
  const size_t x_size = dtype_size(args.x_dtype);
  const IsaLevel level = isa_level();
  const int64_t panels = (w.n + kPanelRows - 1) / kPanelRows;
  // Each thread owns whole panels of rows, so each Y column is written by one thread; the tiles
  // it calls run inside this parallel region on that thread alone.
#pragma omp parallel for schedule(dynamic)
  for (int64_t panel = 0; panel < panels; ++panel) {
    const int64_t j0 = panel * kPanelRows, rows = std::min(kPanelRows, w.n - j0);
    uint16_t* tile = panel_scratch();
    for (int64_t p0 = 0; p0 < w.k; p0 += kPanelDepth) {
      const int64_t depth = std::min(kPanelDepth, w.k - p0);
      dequantize_fp8(w, j0, rows, p0, depth, tile, depth);
      tiled_gemm({.m = args.m,
                  .n = rows,
                  .k = depth,
                  .x = static_cast<const char*>(args.x) + size_t(p0) * x_size,
                  .x_dtype = args.x_dtype,
                  .ldx = ldx,
                  .round_x_to_bf16 = args.round_x_to_bf16,
                  .w = tile,
                  .ldw = depth,
                  .y = args.y + j0,
                  .ldy = ldy,
                  .beta = p0 == 0 ? args.beta : 1.0f},
                 level);
    }
  }
}

void gemm_fp8_reference(const GemmFp8Args& args) {
  check(args);
  const Fp8Matrix& w = *args.w;
  std::vector<uint16_t> dense(size_t(w.n * w.k));
  dequantize_fp8_scalar(w, 0, w.n, 0, w.k, dense.data(), w.k);
  gemm_reference({.m = args.m,
                  .n = w.n,
                  .k = w.k,
                  .x = args.x,
                  .x_dtype = args.x_dtype,
                  .ldx = args.ldx,
                  .w = dense.data(),
                  .y = args.y,
                  .ldy = args.ldy,
                  .beta = args.beta});
}

}  // namespace sluice::cpu
