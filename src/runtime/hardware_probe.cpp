#include "runtime/hardware_probe.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/peaks.h"

namespace sluice {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

SLUICE_AVX512 double sum_avx512(const float* p, size_t n) {
  // Four independent accumulators so the loop is bound by loads, not by add latency.
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
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
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
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

// Roofline: GEMM of m×k by k×n does 2·m·n·k FLOPs on (m·k + n·k)·2 + m·n·4 bytes; at m=2048,
// n=k=4096 that is 68.7 GFLOP on 80 MiB, ~850 FLOP/byte, far above any CPU's balance point
// (~30 FLOP/byte here), so the time is compute time. Without AMX, Sapphire Rapids does bf16 with
// vdpbf16ps: 2 ports × 16 lanes × 4 FLOP = 128 FLOP/cycle/core.
double measure_gemm_peak() {
  constexpr int64_t m = 2048, n = 4096, k = 4096;
  std::vector<uint16_t> x(size_t(m * k)), w(size_t(n * k));
  std::vector<float> y(size_t(m * n));
  // Values in [-1, 1): the speed of the GEMM does not depend on them, but no NaN/denormals.
  for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_bf16(float(int(i % 251) - 125) / 128.0f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(float(int(i % 241) - 120) / 128.0f);
  const cpu::GemmArgs args{
      .m = m, .n = n, .k = k, .x = x.data(), .x_dtype = DType::BF16, .w = w.data(), .y = y.data()};
  cpu::gemm(args);  // primitive creation and first-touch of y
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    auto start = std::chrono::steady_clock::now();
    cpu::gemm(args);
    best = std::min(best, seconds_since(start));
  }
  return 2.0 * double(m) * double(n) * double(k) / best;
}

// Roofline: a pure read stream, 0 FLOP/byte; the 1 GiB buffer is 4× the 260 MiB L3 of the
// Sapphire Rapids hosts we run on, so after the first pass nothing useful is left in cache.
double measure_dram_bandwidth() {
  constexpr size_t bytes = size_t(1) << 30;
  constexpr size_t n = bytes / sizeof(float);
  std::unique_ptr<float, decltype(&std::free)> buffer(
      static_cast<float*>(std::aligned_alloc(64, bytes)), &std::free);
  float* p = buffer.get();
  // The widest loads of the level in force: a plain loop does not keep a core's share of DRAM
  // busy on every CPU.
  auto sum = cpu::isa_at_least(cpu::IsaLevel::kAvx512) ? sum_avx512
             : cpu::isa_at_least(cpu::IsaLevel::kAvx2) ? sum_avx2
                                                       : sum_plain;
  // First touch by the threads that will read it, in the same static partition.
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i += 1024) std::fill(p + i, p + std::min(n, i + 1024), 1.0f);
  double best = 1e30, sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto start = std::chrono::steady_clock::now();
    double total = 0;
#pragma omp parallel reduction(+ : total)
    {
      const size_t threads = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
      const size_t chunk = (n / threads) & ~size_t(63);
      const float* begin = p + t * chunk;
      const size_t count = t + 1 == threads ? n - t * chunk : chunk;
      total += sum(begin, count);
    }
    best = std::min(best, seconds_since(start));
    sink += total;
  }
  // The sum is used so the reads cannot be optimised away.
  if (sink == -1.0) return 0;
  return double(bytes) / best;
}

InstructionCeilings measure_instruction_ceilings() {
  const cpu::InstructionPeaks p = cpu::measure_instruction_peaks();
  return {.fp32_fma_flops = p.fp32_fma_flops,
          .bf16_flops = p.bf16_flops,
          .int8_ops = p.int8_ops,
          .fp32_instruction = cpu::peak_loop_name(p.loops.fp32),
          .bf16_instruction = cpu::peak_loop_name(p.loops.bf16),
          .int8_instruction = cpu::peak_loop_name(p.loops.int8)};
}

double measure_call_overhead() {
  // A tiny GEMM (oneDNN's dispatch; too small to go parallel) and one entry into the OpenMP pool,
  // which every parallel kernel pays; what the latter costs depends on the runtime's wait policy
  // (OMP_WAIT_POLICY=PASSIVE puts idle threads to sleep, so each region wakes them).
  constexpr int64_t n = 64, k = 64;
  std::vector<float> x(size_t(k), 0.5f), y(size_t(n), 0.0f);
  std::vector<uint16_t> w(size_t(n * k), f32_to_bf16(0.25f));
  const cpu::GemmArgs args{
      .m = 1, .n = n, .k = k, .x = x.data(), .x_dtype = DType::F32, .w = w.data(), .y = y.data()};
  cpu::gemm(args);  // primitive creation
  std::vector<int> touched(size_t(omp_get_max_threads()), 0);
  std::vector<double> times(401);
  for (double& t : times) {
    auto start = std::chrono::steady_clock::now();
    cpu::gemm(args);
#pragma omp parallel
    touched[size_t(omp_get_thread_num())] += 1;
    t = seconds_since(start);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace sluice
