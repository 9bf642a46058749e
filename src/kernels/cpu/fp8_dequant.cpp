// FP8 e4m3 codes with their 128 x 128 block scales to bf16 (gemm_fp8.h): apart from the GEMM,
// so that what only dequantizes (model/fp8_weights.cpp) does not link the GEMM kernels.
#include "kernels/cpu/gemm_fp8.h"

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"

namespace sluice::cpu {
namespace {

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

}  // namespace sluice::cpu
