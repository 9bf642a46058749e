#include "kernels/cpu/stream_read.h"

#include <immintrin.h>
#include <omp.h>

#include "kernels/cpu/isa.h"

namespace sluice::cpu {
namespace {

SLUICE_AVX512 double sum_avx512(const float* p, size_t n) {
  // Four independent accumulators so the loop is bound by loads, not by add latency.
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  double s = 0;
  for (float v : lanes) s += v;
  return s;
}

SLUICE_AVX2 double sum_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  double s = 0;
  for (float v : lanes) s += v;
  return s;
}

double sum_plain(const float* p, size_t n) {
  float a[8] = {};
  for (size_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  double s = 0;
  for (float v : a) s += v;
  return s;
}

}  // namespace

double read_stream(const void* data, size_t bytes) {
  auto sum = isa_at_least(IsaLevel::kAvx512) ? sum_avx512
             : isa_at_least(IsaLevel::kAvx2) ? sum_avx2
                                             : sum_plain;
  const float* p = static_cast<const float*>(data);
  const size_t n = bytes / sizeof(float);
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    // The same static partition as the first touch of measure_dram_bandwidth's buffer.
    const size_t threads = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
    const size_t chunk = (n / threads) & ~size_t(63);
    const size_t count = t + 1 == threads ? n - t * chunk : chunk;
    total += sum(p + t * chunk, count);
  }
  return total;
}

}  // namespace sluice::cpu
