#include "kernels/cpu/rope.h"

#include <cmath>
#include <numbers>

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
void cos_sin(float angle, float* cos_out, float* sin_out) {
  *cos_out = float(std::cos(double(angle)));
  *sin_out = float(std::sin(double(angle)));
}

void angles(const RopeArgs& a, int32_t pos, float* cos_out, float* sin_out) {
  for (int i = 0; i < a.rotary_dim / 2; ++i)
    cos_sin(float(pos) * a.inv_freq[i], cos_out + i, sin_out + i);
}

// cos · scale and sin · scale (YaRN's attention factor), as the rotary embedding scales them.
void scale_angles(const RopeArgs& a, float* c, float* s) {
  if (a.scale == 1.0f) return;
  for (int i = 0; i < a.rotary_dim / 2; ++i) {
    c[i] *= a.scale;
    s[i] *= a.scale;
  }
}

// ---- The same angles four at a time (AVX2, double precision). ----
//
// cos/sin of the double value of each fp32 angle a, as angles() computes them:
//  - k = round(a·2/π) and r = a − k·π/2 with π/2 = P1 + P2 (two doubles). a − k·P1 is exact in
//    one FMA: a (a float) and k·P1 are multiples of 2^-52 and the difference is below 1 in
//    magnitude, so it fits 53 bits. k·P2 adds one rounding (2^-53 relative); what P1 + P2 leaves
//    out of π/2 (~1e-33) times k (< 2^24) is negligible.
//  - Taylor series to degree 17 (sin) and 16 (cos) on |r| <= π/4: truncation below 1e-17.
//  - The quadrant k mod 4 swaps and negates the two.
// The double results are within a few 1e-16 of libm's, so after rounding to float they are equal
// to angles()' except when a value lies that close to a float rounding boundary (then 1 ulp).

constexpr double kPio2Hi = 1.5707963267948966;     // double(π/2)
constexpr double kPio2Lo = 6.123233995736766e-17;  // π/2 − kPio2Hi

SLUICE_AVX2 __m256d horner(__m256d z, const double* coefficients, int n) {
  __m256d p = _mm256_set1_pd(coefficients[0]);
  for (int i = 1; i < n; ++i) p = _mm256_fmadd_pd(p, z, _mm256_set1_pd(coefficients[i]));
  return p;
}

SLUICE_AVX2 void sincos4(__m128 angle, __m128* cos_out, __m128* sin_out) {
  // 1/k! for the odd (sin) and even (cos) k, from the highest power down.
  static constexpr double kSin[] = {
      1 / 355687428096000.0, -1 / 1307674368000.0, 1 / 6227020800.0, -1 / 39916800.0,
      1 / 362880.0,          -1 / 5040.0,          1 / 120.0,        -1 / 6.0};
  static constexpr double kCos[] = {1 / 20922789888000.0,
                                    -1 / 87178291200.0,
                                    1 / 479001600.0,
                                    -1 / 3628800.0,
                                    1 / 40320.0,
                                    -1 / 720.0,
                                    1 / 24.0,
                                    -1 / 2.0,
                                    1.0};
  const __m256d a = _mm256_cvtps_pd(angle);
  const __m256d k = _mm256_round_pd(_mm256_mul_pd(a, _mm256_set1_pd(2 / std::numbers::pi)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(kPio2Hi), a);
  r = _mm256_fnmadd_pd(k, _mm256_set1_pd(kPio2Lo), r);
  const __m256d z = _mm256_mul_pd(r, r);
  const __m256d sin_r = _mm256_fmadd_pd(_mm256_mul_pd(z, r), horner(z, kSin, 8), r);
  const __m256d cos_r = horner(z, kCos, 9);
  // Quadrant q = k mod 4: cos(a) = {cos r, −sin r, −cos r, sin r}[q], sin(a) = {sin r, cos r,
  // −sin r, −cos r}[q].
  const __m256i q = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(k));
  const __m256i one = _mm256_set1_epi64x(1), two = _mm256_set1_epi64x(2);
  const __m256d swap = _mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(q, one), one));
  const __m256i cos_negative = _mm256_and_si256(_mm256_add_epi64(q, one), two);  // q = 1, 2
  const __m256i sin_negative = _mm256_and_si256(q, two);                         // q = 2, 3
  const __m256d sign = _mm256_set1_pd(-0.0);
  const __m256d cos_sign =
      _mm256_and_pd(sign, _mm256_castsi256_pd(_mm256_cmpeq_epi64(cos_negative, two)));
  const __m256d sin_sign =
      _mm256_and_pd(sign, _mm256_castsi256_pd(_mm256_cmpeq_epi64(sin_negative, two)));
  *cos_out = _mm256_cvtpd_ps(_mm256_xor_pd(_mm256_blendv_pd(cos_r, sin_r, swap), cos_sign));
  *sin_out = _mm256_cvtpd_ps(_mm256_xor_pd(_mm256_blendv_pd(sin_r, cos_r, swap), sin_sign));
}

SLUICE_AVX2 void angles_avx2(const RopeArgs& a, int32_t pos, float* cos_out, float* sin_out) {
  const int half = a.rotary_dim / 2;
  const __m128 p = _mm_set1_ps(float(pos));
  int i = 0;
  for (; i + 4 <= half; i += 4) {
    __m128 c, s;
    // The fp32 product, rounded as transformers rounds it.
    sincos4(_mm_mul_ps(p, _mm_loadu_ps(a.inv_freq + i)), &c, &s);
    _mm_storeu_ps(cos_out + i, c);
    _mm_storeu_ps(sin_out + i, s);
  }
  for (; i < half; ++i) cos_sin(float(pos) * a.inv_freq[i], cos_out + i, sin_out + i);
}

void rotate_scalar(float* x, int half, const float* c, const float* s) {
  for (int i = 0; i < half; ++i) {
    const float lo = x[i], hi = x[i + half];
    x[i] = lo * c[i] - hi * s[i];
    x[i + half] = hi * c[i] + lo * s[i];
  }
}

void rotate_interleaved_scalar(float* x, int half, const float* c, const float* s) {
  for (int i = 0; i < half; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c[i] - b * s[i];
    x[2 * i + 1] = b * c[i] + a * s[i];
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

// Roofline: per row the cos/sin of rotary_dim/2 angles (libm, or ~40 FLOP each in double on AVX2;
// shared by all heads) plus 6 FLOP per rotated pair; q/k rows are in L1/L2 right after the QKV
// GEMM.
void apply_rope(const RopeArgs& args) {
  const RopeArgs a = resolve(args);
  void (*rotate)(float*, int, const float*, const float*) = rotate_scalar;
  void (*row_angles)(const RopeArgs&, int32_t, float*, float*) = angles;
  if (isa_at_least(IsaLevel::kAvx2)) row_angles = angles_avx2;  // AVX-512 machines too
  if (isa_at_least(IsaLevel::kAvx512))
    rotate = rotate_avx512;
  else if (isa_at_least(IsaLevel::kAvx2))
    rotate = rotate_avx2;
  if (a.interleaved) rotate = rotate_interleaved_scalar;
  const int half = a.rotary_dim / 2;
#pragma omp parallel if (a.rows >= 16)
  {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a.rows; ++r) {
      row_angles(a, a.positions[r], c.data(), s.data());
      scale_angles(a, c.data(), s.data());
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
    scale_angles(a, c.data(), s.data());
    for (int h = 0; h < a.n_heads; ++h)
      (a.interleaved ? rotate_interleaved_scalar : rotate_scalar)(
          a.x + r * a.row_stride + int64_t(h) * a.head_dim, half, c.data(), s.data());
  }
}

}  // namespace sluice::cpu
