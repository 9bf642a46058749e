// Hardware profiles in round numbers for planner tests, so their arithmetic can be done by hand.
#pragma once

#include <cstdint>

#include "runtime/planner/hardware_profile.h"

namespace sluice::testing {

// A GEMM time curve that follows the roofline max(weight bytes / bw, FLOPs / peak) exactly, with
// its corner at m = peak / bw (points 1 and the corner are weight bound).
inline GemmCurve roofline_curve(const char* name, int64_t n, int64_t k, double bw, double peak) {
  const double w = 2.0 * double(n) * double(k);
  const int64_t ridge = int64_t(peak / bw);
  return GemmCurve{name,
                   "bf16",
                   n,
                   k,
                   {{1, w / bw}, {ridge, w / bw}, {8192, 2.0 * 8192 * double(n * k) / peak}}};
}

struct SyntheticGpu {
  double h2d = 2e10, d2h = 2e10;  // pinned copies, B/s (pageable: 1e10)
  double memory_bytes_per_s = 1e12;
  double gemm_flops = 1e14;
  size_t memory_free_bytes = size_t(80) << 30;
};

// CPU: 1e11 B/s DRAM, 1e12 FLOP/s GEMM, 5e10 B/s and 2e11 FLOP/s attention, 1e11 B/s
// elementwise; and a GPU as given, with Mixtral-8x7B-shaped GEMM curves.
inline HardwareProfile synthetic_gpu_profile(const SyntheticGpu& s = {}) {
  HardwareProfile p = quick_profile(1e11, 1e12);
  p.source = "synthetic";
  p.attention_bytes_per_s = 5e10;
  p.attention_flops = 2e11;
  p.elementwise_bytes_per_s = 1e11;
  GpuProfile g;
  g.name = "synthetic GPU";
  g.h2d_pinned_bytes_per_s = s.h2d;
  g.d2h_pinned_bytes_per_s = s.d2h;
  g.h2d_pageable_bytes_per_s = g.d2h_pageable_bytes_per_s = 1e10;
  g.memory_bytes_per_s = s.memory_bytes_per_s;
  g.memory_free_bytes = s.memory_free_bytes;
  g.gemm = {roofline_curve("expert", 14336, 4096, s.memory_bytes_per_s, s.gemm_flops),
            roofline_curve("expert_down", 4096, 14336, s.memory_bytes_per_s, s.gemm_flops),
            roofline_curve("attention", 4096, 4096, s.memory_bytes_per_s, s.gemm_flops)};
  p.gpu = g;
  return p;
}

}  // namespace sluice::testing
