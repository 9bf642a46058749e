#include "kernels/cpu/activation.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/simd_avx512.h"

namespace sluice::cpu {
namespace {

SLUICE_AVX512 void silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : avx512::tail_mask(int(n - i));
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    // exp(-g) overflows to +inf for g < -88.7, giving g / inf = -0, as in torch.
    const __m512 denom = _mm512_add_ps(one, avx512::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g)));
    const __m512 silu = _mm512_div_ps(g, denom);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

SLUICE_AVX2 __m256 silu_mul_avx2_vec(__m256 g, __m256 u) {
  // exp(-g) overflows to +inf for g < -88.7, giving g / inf = -0, as in torch.
  const __m256 e = avx2::exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

SLUICE_AVX2 void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     silu_mul_avx2_vec(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const int rest = int(n - i);
    avx2::store_partial(
        out + i, rest,
        silu_mul_avx2_vec(avx2::load_partial(gate + i, rest), avx2::load_partial(up + i, rest)));
  }
}

}  // namespace

// Roofline: 12 bytes per element (two reads, one write) for ~25 FLOP: bandwidth bound when the
// rows come from DRAM, but they are the output of the gate/up GEMM and usually still in L2.
void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  void (*chunk)(const float*, const float*, float*, int64_t) = nullptr;
  if (isa_at_least(IsaLevel::kAvx512))
    chunk = silu_mul_avx512;
  else if (isa_at_least(IsaLevel::kAvx2))
    chunk = silu_mul_avx2;
  else
    return silu_mul_reference(gate, up, out, n);
  constexpr int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n >= 4 * kChunk)
  for (int64_t c = 0; c < n; c += kChunk) chunk(gate + c, up + c, out + c, std::min(kChunk, n - c));
}

void silu_mul_reference(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace sluice::cpu
