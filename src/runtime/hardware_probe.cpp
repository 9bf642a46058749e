#include "runtime/hardware_probe.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/clock.h"
#include "core/dtype.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/peaks.h"
#include "kernels/cpu/stream_read.h"

namespace sluice {

// Roofline: GEMM of m×k by k×n does 2·m·n·k FLOPs on (m·k + n·k)·2 + m·n·4 bytes; at m=2048,
// n=k=4096 that is 68.7 GFLOP on 80 MiB, ~850 FLOP/byte, far above any CPU's balance point
// (~30 FLOP/byte here), so the time is compute time. Without AMX, Sapphire Rapids does bf16 with
// vdpbf16ps: 2 ports × 16 lanes × 4 FLOP = 128 FLOP/cycle/core. A slow level (scalar code does
// about 6 GFLOP/s on 2 cores) would take 11 s a call at m=2048, so m is cut to what runs in about
// 0.2 s at the rate of a first call at m=128 (still ~126 FLOP/byte: compute-bound).
double measure_gemm_peak() {
  constexpr int64_t max_m = 2048, probe_m = 128, n = 4096, k = 4096;
  constexpr double kSecondsPerCall = 0.2;
  std::vector<uint16_t> x(size_t(max_m * k)), w(size_t(n * k));
  std::vector<float> y(size_t(max_m * n));
  // Values in [-1, 1): the speed of the GEMM does not depend on them, but no NaN/denormals.
  for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_bf16(float(int(i % 251) - 125) / 128.0f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(float(int(i % 241) - 120) / 128.0f);
  const auto flops = [&](int64_t m) { return 2.0 * double(m) * double(n) * double(k); };
  const auto best_of = [&](int64_t m, int reps) {
    const cpu::GemmArgs args{.m = m, .n = n, .k = k, .x = x.data(), .x_dtype = DType::BF16,
                             .w = w.data(), .y = y.data()};
    cpu::gemm(args);  // primitive creation and first-touch of y
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      const auto start = Clock::now();
      cpu::gemm(args);
      best = std::min(best, seconds_since(start));
    }
    return best;
  };
  const double probe_rate = flops(probe_m) / best_of(probe_m, 1);
  const int64_t fits = int64_t(kSecondsPerCall * probe_rate / flops(1)) / probe_m * probe_m;
  const int64_t m = std::clamp(fits, probe_m, max_m);
  return flops(m) / best_of(m, 3);
}

// Roofline: a pure read stream, 0 FLOP/byte; the 1 GiB buffer is 4× the 260 MiB L3 of the
// Sapphire Rapids hosts we run on, so after the first pass nothing useful is left in cache.
double measure_dram_bandwidth() {
  constexpr size_t bytes = size_t(1) << 30;
  constexpr size_t n = bytes / sizeof(float);
  std::unique_ptr<float, decltype(&std::free)> buffer(
      static_cast<float*>(std::aligned_alloc(64, bytes)), &std::free);
  float* p = buffer.get();
  // First touch by the threads that will read it, in read_stream's static partition.
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i += 1024) std::fill(p + i, p + std::min(n, i + 1024), 1.0f);
  double best = 1e30, sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto start = Clock::now();
    sink += cpu::read_stream(p, bytes);
    best = std::min(best, seconds_since(start));
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
    auto start = Clock::now();
    cpu::gemm(args);
#pragma omp parallel
    touched[size_t(omp_get_thread_num())] += 1;
    t = seconds_since(start);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace sluice
