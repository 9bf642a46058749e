#include "kernels/cpu/rope.h"

#include <cmath>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/simd_avx512.h"

namespace sluice::cpu {
namespace {

RopeArgs resolve(const RopeArgs& in) {
  RopeArgs a = in;
  if (a.rotary_dim == 0) a.rotary_dim = a.head_dim;
  if (a.row_stride == 0) a.row_stride = int64_t(a.n_heads) * a.head_dim;
  if (a.n_heads <= 0 || a.head_dim <= 0 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_dim ||
      a.row_stride < int64_t(a.n_heads) * a.head_dim)
    fail(
        "rope: field 'shape': expected n_heads > 0, an even rotary_dim <= head_dim and "
        "row_stride >= n_heads·head_dim, got n_heads={} head_dim={} rotary_dim={} row_stride={}",
        a.n_heads, a.head_dim, a.rotary_dim, a.row_stride);
  return a;
}

// cos and sin of float(pos)·inv_freq[i], the fp32 angle, evaluated accurately (double cos of the
// float argument, then rounded) so they match torch's fp32 cos/sin to within an ulp.
void angles(const RopeArgs& a, int32_t pos, float* cos_out, float* sin_out) {
  for (int i = 0; i < a.rotary_dim / 2; ++i) {
    const float angle = float(pos) * a.inv_freq[i];
    cos_out[i] = float(std::cos(double(angle)));
    sin_out[i] = float(std::sin(double(angle)));
  }
}

void rotate_scalar(float* x, int half, const float* c, const float* s) {
  for (int i = 0; i < half; ++i) {
    const float lo = x[i], hi = x[i + half];
    x[i] = lo * c[i] - hi * s[i];
    x[i + half] = hi * c[i] + lo * s[i];
  }
}

SLUICE_AVX512 void rotate_avx512(float* x, int half, const float* c, const float* s) {
  for (int i = 0; i < half; i += 16) {
    const __mmask16 m = half - i >= 16 ? __mmask16(0xffff) : avx512::tail_mask(half - i);
    const __m512 lo = _mm512_maskz_loadu_ps(m, x + i), hi = _mm512_maskz_loadu_ps(m, x + i + half);
    const __m512 cv = _mm512_maskz_loadu_ps(m, c + i), sv = _mm512_maskz_loadu_ps(m, s + i);
    // GCC contracts one product of each output into an FMA here (-ffp-contract=fast, the GNU
    // default), so this is within an ulp of the scalar form, not bit for bit.
    _mm512_mask_storeu_ps(x + i, m, _mm512_sub_ps(_mm512_mul_ps(lo, cv), _mm512_mul_ps(hi, sv)));
    _mm512_mask_storeu_ps(x + i + half, m,
                          _mm512_add_ps(_mm512_mul_ps(hi, cv), _mm512_mul_ps(lo, sv)));
  }
}

// Eight pairs. One product of each output is fused into an FMA, written out rather than left to
// the compiler's contraction (which GCC applies to the AVX-512 form above): one rounding fewer
// than the scalar form, so within an ulp of it.
SLUICE_AVX2 void rotate8_avx2(__m256 lo, __m256 hi, __m256 c, __m256 s, __m256* lo_out,
                              __m256* hi_out) {
  *lo_out = _mm256_fmsub_ps(lo, c, _mm256_mul_ps(hi, s));
  *hi_out = _mm256_fmadd_ps(hi, c, _mm256_mul_ps(lo, s));
}

SLUICE_AVX2 void rotate_avx2(float* x, int half, const float* c, const float* s) {
  __m256 lo, hi;
  int i = 0;
  for (; i + 8 <= half; i += 8) {
    rotate8_avx2(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i + half), _mm256_loadu_ps(c + i),
                 _mm256_loadu_ps(s + i), &lo, &hi);
    _mm256_storeu_ps(x + i, lo);
    _mm256_storeu_ps(x + i + half, hi);
  }
  if (i < half) {
    const int n = half - i;
    rotate8_avx2(avx2::load_partial(x + i, n), avx2::load_partial(x + i + half, n),
                 avx2::load_partial(c + i, n), avx2::load_partial(s + i, n), &lo, &hi);
    avx2::store_partial(x + i, n, lo);
    avx2::store_partial(x + i + half, n, hi);
  }
}

}  // namespace

std::vector<float> rope_inv_freq(int rotary_dim, float theta) {
  std::vector<float> inv_freq(size_t(rotary_dim / 2));
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const float exponent = float(2 * i) / float(rotary_dim);  // arange(0, d, 2).float() / d
    inv_freq[size_t(i)] = 1.0f / std::pow(theta, exponent);   // fp32 powf, fp32 reciprocal
  }
  return inv_freq;
}

// Roofline: per row the cos/sin of rotary_dim/2 angles (scalar libm, shared by all heads) plus
// 6 FLOP per rotated pair; q/k rows are in L1/L2 right after the QKV GEMM.
void apply_rope(const RopeArgs& args) {
  const RopeArgs a = resolve(args);
  void (*rotate)(float*, int, const float*, const float*) = rotate_scalar;
  if (isa_at_least(IsaLevel::kAvx512))
    rotate = rotate_avx512;
  else if (isa_at_least(IsaLevel::kAvx2))
    rotate = rotate_avx2;
  const int half = a.rotary_dim / 2;
#pragma omp parallel if (a.rows >= 16)
  {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a.rows; ++r) {
      angles(a, a.positions[r], c.data(), s.data());
      for (int h = 0; h < a.n_heads; ++h)
        rotate(a.x + r * a.row_stride + int64_t(h) * a.head_dim, half, c.data(), s.data());
    }
  }
}

void apply_rope_reference(const RopeArgs& args) {
  const RopeArgs a = resolve(args);
  const int half = a.rotary_dim / 2;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t r = 0; r < a.rows; ++r) {
    angles(a, a.positions[r], c.data(), s.data());
    for (int h = 0; h < a.n_heads; ++h)
      rotate_scalar(a.x + r * a.row_stride + int64_t(h) * a.head_dim, half, c.data(), s.data());
  }
}

}  // namespace sluice::cpu
