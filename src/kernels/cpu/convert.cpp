#include "kernels/cpu/convert.h"

#include <immintrin.h>

#include "core/dtype.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/simd_avx512.h"

namespace sluice::cpu {
namespace {

SLUICE_AVX512_BF16 void f32_to_bf16_avx512(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256bh packed = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<__m256i&>(packed));
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

SLUICE_AVX512 void bf16_to_f32_avx512(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, avx512::load_bf16(src + i));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// Eight fp32 → eight bf16 in the low 16 bits of each 32-bit lane, bit for bit f32_to_bf16: round
// to nearest even by adding 0x7fff plus the lowest kept bit, NaN kept quiet (payload | 0x40).
SLUICE_AVX2 __m256i round_to_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

SLUICE_AVX2 void f32_to_bf16_avx2(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = round_to_bf16(_mm256_loadu_ps(src + i));
    const __m256i hi = round_to_bf16(_mm256_loadu_ps(src + i + 8));
    // packus works within 128-bit lanes ([lo0-3 hi0-3 lo4-7 hi4-7]); the permute restores order.
    // The values are 0..0xffff, so the unsigned saturation never changes one.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

SLUICE_AVX2 void bf16_to_f32_avx2(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, avx2::load_bf16(src + i));
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace

void f32_to_bf16_row(const float* src, uint16_t* dst, size_t n) {
  if (isa_at_least(IsaLevel::kAvx512Bf16)) return f32_to_bf16_avx512(src, dst, n);
  if (isa_at_least(IsaLevel::kAvx2)) return f32_to_bf16_avx2(src, dst, n);
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void bf16_to_f32_row(const uint16_t* src, float* dst, size_t n) {
  if (isa_at_least(IsaLevel::kAvx512)) return bf16_to_f32_avx512(src, dst, n);
  if (isa_at_least(IsaLevel::kAvx2)) return bf16_to_f32_avx2(src, dst, n);
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace sluice::cpu
