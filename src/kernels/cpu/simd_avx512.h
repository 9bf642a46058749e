// AVX-512 helpers shared by the CPU kernels. Include only from .cpp files; every function carries
// the target attribute, so callers must be SLUICE_AVX512 functions themselves.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/isa.h"

// GCC 12 warns "__Y may be used uninitialized" inside many AVX-512 intrinsics (they start from
// _mm512_undefined_*()) when they are inlined into target-attribute functions (GCC bug 105593,
// fixed in GCC 13). The warning is about the header, not our code; it is silenced for the rest
// of each kernel .cpp that includes this file. Clang has neither the bug nor the warning group.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace sluice::cpu::avx512 {

// 16 bf16 → 16 fp32: widen to 32 bits and shift into the high half (bf16 is truncated fp32).
SLUICE_AVX512 inline __m512 load_bf16(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  __m512i widened = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
  return _mm512_castsi512_ps(widened);
}

// First n (< 16) bf16 → fp32, the rest zero.
SLUICE_AVX512 inline __m512 load_bf16_partial(const uint16_t* p, int n) {
  __mmask16 mask = __mmask16((1u << n) - 1u);
  __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  __m512i widened = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
  return _mm512_castsi512_ps(widened);
}

SLUICE_AVX512 inline __mmask16 tail_mask(int n) {
  return __mmask16((1u << n) - 1u);
}

// exp(x) for fp32 lanes: 2^(x·log2 e) split into an integer power (exponent bits) and a degree-7
// polynomial on the remainder, |r| <= ln2/2. Accuracy (every float in [-104, 89], measured against
// the correctly rounded exp): within 1 ulp where the result is a normal float, relative error
// < 8e-8; CpuVectorExp checks it. scalef saturates: inputs above ~88.72 give +inf, results below
// the normal range round to subnormals and then 0 (below ~-103.3); the clamp only keeps the
// integer part finite.
SLUICE_AVX512 inline __m512 exp_ps(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(89.0f));
  __m512 t = _mm512_mul_ps(x, log2e);
  __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n·ln2 in two parts (Cody–Waite) so the reduction keeps full precision.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  // e^r on |r| <= ln2/2: Taylor coefficients 1/k! up to degree 7 (degree 6 alone is 3 ulp off).
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  // scalef multiplies by 2^n, handling overflow to inf and underflow to 0.
  return _mm512_scalef_ps(p, n);
}

}  // namespace sluice::cpu::avx512
