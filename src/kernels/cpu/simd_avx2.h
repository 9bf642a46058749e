// AVX2 (+FMA) helpers shared by the CPU kernels, the 256-bit counterparts of simd_avx512.h.
// Include only from .cpp files; every function carries the target attribute, so callers must be
// SLUICE_AVX2 functions themselves. AVX2 has no mask registers: partial vectors go through
// vmaskmovps with a lane mask from tail_mask(), or through a small zero-padded copy for bf16.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/isa.h"

namespace sluice::cpu::avx2 {

// Lane mask with the first n (0..8) lanes set, for _mm256_maskload_ps / _mm256_maskstore_ps.
SLUICE_AVX2 inline __m256i tail_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// First n (<= 8) floats of p, the rest zero; only the first n are read.
SLUICE_AVX2 inline __m256 load_partial(const float* p, int n) {
  return _mm256_maskload_ps(p, tail_mask(n));
}
SLUICE_AVX2 inline void store_partial(float* p, int n, __m256 v) {
  _mm256_maskstore_ps(p, tail_mask(n), v);
}

// 8 bf16 → 8 fp32: widen to 32 bits and shift into the high half (bf16 is truncated fp32), so
// no F16C and no rounding: the result is exact.
SLUICE_AVX2 inline __m256 load_bf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Eight fp32 → eight bf16 in the low 16 bits of each 32-bit lane, bit for bit f32_to_bf16: round
// to nearest even by adding 0x7fff plus the lowest kept bit, NaN kept quiet (payload | 0x40).
SLUICE_AVX2 inline __m256i round_to_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

// First n (< 8) bf16 → fp32, the rest zero; only the first n are read.
SLUICE_AVX2 inline __m256 load_bf16_partial(const uint16_t* p, int n) {
  uint16_t padded[8] = {};
  std::memcpy(padded, p, size_t(n) * sizeof(uint16_t));
  return load_bf16(padded);
}

// Sum of the 8 lanes.
SLUICE_AVX2 inline float reduce_add(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));  // lanes 0+2, 1+3
  s = _mm_add_ss(s, _mm_movehdup_ps(s));   // + lane 1
  return _mm_cvtss_f32(s);
}

// Maximum of the 8 lanes.
SLUICE_AVX2 inline float reduce_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for fp32 lanes, the algorithm of avx512::exp_ps (same polynomial, same single rounding):
// 2^(x·log2 e) split into an integer power n and a degree-7 polynomial on the remainder
// r = x − n·ln2, |r| <= ln2/2. Accuracy (every float in [-104, 89], measured against the
// correctly rounded exp): within 1 ulp where the result is a normal float, relative error
// < 8e-8; CpuVectorExp checks it. AVX2 has no scalef, so 2^n is applied as two exact powers of
// two built in the exponent bits (n = n1 + n2, each in [-75, 64]), which reproduces scalef's
// saturation: x above ~88.72 gives +inf, results below the normal range round to subnormals and
// then 0 (x below ~-103.3).
SLUICE_AVX2 inline __m256 exp_ps(__m256 x) {
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
  x = _mm256_min_ps(x, _mm256_set1_ps(89.0f));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n·ln2 in two parts (Cody–Waite) so the reduction keeps full precision.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  // e^r on |r| <= ln2/2: Taylor coefficients 1/k! up to degree 7 (degree 6 alone is 3 ulp off).
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // n in [-150, 128]: n1 = n >> 1 and n2 = n - n1 are both in [-75, 64], so 2^n1 and 2^n2 are
  // normal floats and p·2^n1 (p in [0.7, 1.42]) is exact; the second product rounds once, as
  // scalef does.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

}  // namespace sluice::cpu::avx2
