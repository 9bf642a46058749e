#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/simd_avx512.h"

namespace sluice::cpu {
namespace {

RmsNormArgs resolve(const RmsNormArgs& in) {
  RmsNormArgs a = in;
  if (a.x_stride == 0) a.x_stride = a.dim;
  if (a.y_stride == 0) a.y_stride = a.dim;
  if (a.rows < 0 || a.dim <= 0 || a.x_stride < a.dim || a.y_stride < a.dim)
    fail(
        "rms_norm: field 'shape': expected rows >= 0, dim > 0, strides >= dim, got rows={} "
        "dim={} strides {} {}",
        a.rows, a.dim, a.x_stride, a.y_stride);
  if (a.weight_dtype != DType::F32 && a.weight_dtype != DType::BF16)
    fail("rms_norm: field 'weight_dtype': expected F32 or BF16, got {}",
         dtype_name(a.weight_dtype));
  return a;
}

float weight_at(const RmsNormArgs& a, int64_t i) {
  return a.weight_dtype == DType::F32 ? static_cast<const float*>(a.weight)[i]
                                      : bf16_to_f32(static_cast<const uint16_t*>(a.weight)[i]);
}

SLUICE_AVX512 __m512 load_weight(const RmsNormArgs& a, int64_t i, __mmask16 mask) {
  if (a.weight_dtype == DType::F32)
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(a.weight) + i);
  const uint16_t* w = static_cast<const uint16_t*>(a.weight) + i;
  return mask == 0xffff ? avx512::load_bf16(w)
                        : avx512::load_bf16_partial(w, __builtin_popcount(mask));
}

SLUICE_AVX512 void rms_norm_row_avx512(const RmsNormArgs& a, const float* x, float* y) {
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < a.dim; i += 16) {
    const __mmask16 m = a.dim - i >= 16 ? __mmask16(0xffff) : avx512::tail_mask(int(a.dim - i));
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    sum = _mm512_fmadd_ps(v, v, sum);
  }
  const float inv_rms = 1.0f / std::sqrt(_mm512_reduce_add_ps(sum) / float(a.dim) + a.eps);
  const __m512 scale = _mm512_set1_ps(inv_rms);
  for (int64_t i = 0; i < a.dim; i += 16) {
    const __mmask16 m = a.dim - i >= 16 ? __mmask16(0xffff) : avx512::tail_mask(int(a.dim - i));
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, load_weight(a, i, m)));
  }
}

SLUICE_AVX2 __m256 load_weight_avx2(const RmsNormArgs& a, int64_t i, int n) {
  if (a.weight_dtype == DType::F32) {
    const float* w = static_cast<const float*>(a.weight) + i;
    return n == 8 ? _mm256_loadu_ps(w) : avx2::load_partial(w, n);
  }
  const uint16_t* w = static_cast<const uint16_t*>(a.weight) + i;
  return n == 8 ? avx2::load_bf16(w) : avx2::load_bf16_partial(w, n);
}

// Sum of squares in two accumulators (FMA latency 4-5 cycles, two FMA ports), then the scaled
// row; the tail is one masked vector.
SLUICE_AVX2 void rms_norm_row_avx2(const RmsNormArgs& a, const float* x, float* y) {
  __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= a.dim; i += 16) {
    const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    sum0 = _mm256_fmadd_ps(v0, v0, sum0);
    sum1 = _mm256_fmadd_ps(v1, v1, sum1);
  }
  for (; i < a.dim; i += 8) {
    const __m256 v = avx2::load_partial(x + i, int(std::min<int64_t>(8, a.dim - i)));
    sum0 = _mm256_fmadd_ps(v, v, sum0);
  }
  const float sum = avx2::reduce_add(_mm256_add_ps(sum0, sum1));
  const __m256 scale = _mm256_set1_ps(1.0f / std::sqrt(sum / float(a.dim) + a.eps));
  for (i = 0; i + 8 <= a.dim; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), scale);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, load_weight_avx2(a, i, 8)));
  }
  if (i < a.dim) {
    const int n = int(a.dim - i);
    const __m256 v = _mm256_mul_ps(avx2::load_partial(x + i, n), scale);
    avx2::store_partial(y + i, n, _mm256_mul_ps(v, load_weight_avx2(a, i, n)));
  }
}

void rms_norm_row_scalar(const RmsNormArgs& a, const float* x, float* y) {
  float sum = 0;
  for (int64_t i = 0; i < a.dim; ++i) sum += x[i] * x[i];
  const float inv_rms = 1.0f / std::sqrt(sum / float(a.dim) + a.eps);
  for (int64_t i = 0; i < a.dim; ++i) y[i] = x[i] * inv_rms * weight_at(a, i);
}

}  // namespace

// Roofline: reads x and writes y once (8 bytes per element) for ~4 FLOP per element: bandwidth
// bound; rows usually sit in L2 right after the producing GEMM.
void rms_norm(const RmsNormArgs& args) {
  const RmsNormArgs a = resolve(args);
  void (*row)(const RmsNormArgs&, const float*, float*) = rms_norm_row_scalar;
  if (isa_at_least(IsaLevel::kAvx512))
    row = rms_norm_row_avx512;
  else if (isa_at_least(IsaLevel::kAvx2))
    row = rms_norm_row_avx2;
#pragma omp parallel for schedule(static) if (a.rows * a.dim >= (1 << 16))
  for (int64_t r = 0; r < a.rows; ++r) row(a, a.x + r * a.x_stride, a.y + r * a.y_stride);
}

void rms_norm_reference(const RmsNormArgs& args) {
  const RmsNormArgs a = resolve(args);
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.x_stride;
    float* y = a.y + r * a.y_stride;
    double sum = 0;
    for (int64_t i = 0; i < a.dim; ++i) sum += double(x[i]) * x[i];
    const double inv_rms = 1.0 / std::sqrt(sum / double(a.dim) + a.eps);
    for (int64_t i = 0; i < a.dim; ++i) y[i] = float(x[i] * inv_rms * weight_at(a, i));
  }
}

// Roofline: three reads and one write of the row for ~6 FLOP per element, bandwidth bound like
// rms_norm; the scalar loop is fine at a few rows of hidden size per layer.
void layer_norm(const RmsNormArgs& args) {
  const RmsNormArgs a = resolve(args);
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.x_stride;
    float* y = a.y + r * a.y_stride;
    float sum = 0;
    for (int64_t i = 0; i < a.dim; ++i) sum += x[i];
    const float mean = sum / float(a.dim);
    float squares = 0;
    for (int64_t i = 0; i < a.dim; ++i) squares += (x[i] - mean) * (x[i] - mean);
    const float inv_std = 1.0f / std::sqrt(squares / float(a.dim) + a.eps);
    for (int64_t i = 0; i < a.dim; ++i) y[i] = (x[i] - mean) * inv_std * weight_at(a, i);
  }
}

void layer_norm_reference(const RmsNormArgs& args) {
  const RmsNormArgs a = resolve(args);
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.x_stride;
    float* y = a.y + r * a.y_stride;
    double sum = 0;
    for (int64_t i = 0; i < a.dim; ++i) sum += x[i];
    const double mean = sum / double(a.dim);
    double squares = 0;
    for (int64_t i = 0; i < a.dim; ++i) squares += (x[i] - mean) * (x[i] - mean);
    const double inv_std = 1.0 / std::sqrt(squares / double(a.dim) + a.eps);
    for (int64_t i = 0; i < a.dim; ++i) y[i] = float((x[i] - mean) * inv_std * weight_at(a, i));
  }
}

}  // namespace sluice::cpu
