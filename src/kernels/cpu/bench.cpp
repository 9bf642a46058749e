#include "kernels/cpu/bench.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace sluice::cpu {
namespace {

template <typename F>
double best_seconds(F&& run, double min_seconds) {
  run();  // warm-up: primitive creation, first touch, page faults
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 3 || total < min_seconds; ++rep) {
    auto start = std::chrono::steady_clock::now();
    run();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

}  // namespace

// Roofline for the expert GEMM: intensity = 2·m·n·k / (2·n·k + ...) ≈ m FLOP/byte when the
// weight dominates the traffic. With ~15 GB/s of DRAM and a measured bf16 peak P, the GEMM stops
// being weight-bandwidth bound at m ≈ P / 15e9 (the ridge point); below it the achieved FLOP/s
// grows linearly with m.
KernelTiming bench_gemm(int64_t m, int64_t n, int64_t k, DType x_dtype, GemmRowMode mode,
                        double min_seconds) {
  // Enough copies of W that together they are 3× the 260 MiB L3: each call then reads its W from
  // DRAM, as the engine does for weights streamed once per step.
  const size_t w_elems = size_t(n * k);
  const size_t copies = std::clamp<size_t>((size_t(768) << 20) / (2 * w_elems) + 1, 1, 64);
  std::vector<uint16_t> w(w_elems * copies), xb(size_t(m * k));
  std::vector<float> xf(size_t(m * k)), y(size_t(m * n));
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(float(int(i % 241) - 120) / 128.0f);
  for (size_t i = 0; i < xf.size(); ++i) {
    xf[i] = float(int(i % 251) - 125) / 128.0f;
    xb[i] = f32_to_bf16(xf[i]);
  }
  const GemmRowMode saved = gemm_row_mode();
  set_gemm_row_mode(mode);
  const GemmArgs args{.m = m,
                      .n = n,
                      .k = k,
                      .x = x_dtype == DType::F32 ? static_cast<const void*>(xf.data()) : xb.data(),
                      .x_dtype = x_dtype,
                      .w = w.data(),
                      .y = y.data()};
  size_t call = 0;
  KernelTiming t;
  t.seconds = best_seconds(
      [&] {
        GemmArgs a = args;
        a.w = w.data() + (call++ % copies) * w_elems;
        gemm(a);
      },
      min_seconds);
  set_gemm_row_mode(saved);
  t.flops = 2.0 * double(m) * double(n) * double(k);
  t.bytes = 2.0 * double(n * k) + double(m * k) * double(dtype_size(x_dtype)) + 4.0 * double(m * n);
  return t;
}

}  // namespace sluice::cpu
