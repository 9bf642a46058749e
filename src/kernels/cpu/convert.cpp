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

SLUICE_AVX2 void f32_to_bf16_avx2(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = avx2::round_to_bf16(_mm256_loadu_ps(src + i));
    const __m256i hi = avx2::round_to_bf16(_mm256_loadu_ps(src + i + 8));
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
