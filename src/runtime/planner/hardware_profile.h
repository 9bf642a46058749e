// What the planner knows about a machine: measured ceilings and kernel rate curves, as plain data
// that round-trips through JSON (the `sluice profile` cache). The measuring lives in profiler.h;
// this file only holds the numbers and answers "how long does a GEMM of this shape take".
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/hardware_probe.h"

namespace sluice {

// Best time of one GEMM Y[m,n] = X[m,k]·Wᵀ (W bf16, streamed from DRAM) at several m.
struct GemmCurve {
  std::string name;         // "expert", "attention"
  std::string activations;  // "bf16" (cpu::gemm) or "f32" (cpu::gemm_f32)
  int64_t n = 0, k = 0;
  struct Point {
    int64_t m = 0;
    double seconds = 0;
  };
  std::vector<Point> points;  // increasing m

  // Time of one call at m rows, linear between measured points (a GEMM's time is close to
  // piecewise linear in m: flat while weight-bandwidth bound, then proportional to m); past the
  // last point, proportional to m at the last point's rate.
  double seconds_at(double m) const;
};

// Of `curves` with these activations, the one whose weight size n·k is closest to the asked
// shape (of equal sizes, the one with the closest n); fails naming `what` when there is none.
const GemmCurve& nearest_curve(const std::vector<GemmCurve>& curves, int64_t n, int64_t k,
                               const std::string& activations, const char* what);

// How much faster than the bf16 GEMM the int8 and int4 GEMMs of quantized experts run, at a few
// m: at decode's m = 16, 17 and 32 on a 14336 × 4096 expert weight streamed from DRAM, where
// int8 also reads half the bytes, and where the bf16 GEMM's token lanes start a new block of 16
// rows or hand the rows past 16 to their leftover tiles (gemm_lanes.h); and at m = 128 on one 1024
// × 4096 weight, where all three are compute bound (the rates of the kernels as written, which at
// the avx2 level need an instruction more per int8 product than the peak loop has). On 2 Zen 4
// cores (2026-12-06) int8 decode ran 2.19× bf16's where the m = 128 figure said 1.73×, and the plan
// predicted int8 decode 25% low with that one figure.
struct QuantGemmSpeedups {
  struct Point {
    int64_t m = 0;
    double int8 = 0, int4 = 0;
  };
  std::vector<Point> points;  // increasing m; none: not measured (older profiles)
  // At m rows, interpolated in log m between the points (the first one's below them, the last
  // one's above); 0 when none were measured, and the planner then takes the ratio of the
  // instruction peaks.
  double at(bool int4, double m) const;
};
nlohmann::json to_json(const QuantGemmSpeedups& s);
// Absent or null (older profiles): no points.
QuantGemmSpeedups quant_gemm_speedups_from_json(const nlohmann::json& j, const std::string& source);

// Measured by the CUDA backend when there is a GPU; absent (JSON null) otherwise.
struct GpuProfile {
  std::string name;
  double h2d_pinned_bytes_per_s = 0, h2d_pageable_bytes_per_s = 0;
  double d2h_pinned_bytes_per_s = 0, d2h_pageable_bytes_per_s = 0;
  // Device memory bandwidth from a device-to-device copy (read + write bytes); 0 when the
  // profile predates it.
  double memory_bytes_per_s = 0;
  size_t memory_free_bytes = 0;
  std::vector<GemmCurve> gemm;  // GPU bf16 GEMM time versus m (cuBLASLt)

  // Predicted time of one GPU GEMM: the nearest curve's time, scaled by the weight size ratio.
  double gemm_seconds(double m, int64_t n, int64_t k) const;
  // The best FLOP rate any measured point reached (the GPU's practical GEMM peak).
  double gemm_peak_flops() const;
};

struct HardwareProfile {
  std::string machine_key;  // hash of CPU model, cores, memory size and hostname
  std::string cpu_model;    // the CPU's brand string (cpu::cpu_model_name())
  std::string isa_level;    // the ISA level the kernels ran at ("avx2"); "" in older profiles
  int cores = 0;
  int threads = 0;  // OpenMP threads the measurements used (the engine's policy.threads)
  size_t memory_bytes = 0;
  std::string source;        // "measured" (sluice profile) or "quick" (built from measure_ceilings)
  int kernels_revision = 0;  // cpu::kKernelsRevision of the build that measured it (0: older)

  double dram_bytes_per_s = 0;         // streaming read, all threads
  double gemm_peak_flops = 0;          // large bf16 GEMM through cpu::gemm: sluice's own best
  InstructionCeilings instructions;    // the machine's compute ceilings at isa_level
  double disk_bytes_per_s = 0;         // sequential O_DIRECT read; 0 when not measured
  double attention_bytes_per_s = 0;    // decode paged attention, KV bytes read per second
  double attention_flops = 0;          // prefill paged attention, FLOP/s
  double elementwise_bytes_per_s = 0;  // norms, SiLU·mul, gather/scatter on cache-warm buffers
  double call_overhead_seconds = 0;    // one kernel call doing ~nothing (0: not measured)
  QuantGemmSpeedups quant_gemm;        // the int8 and int4 GEMMs against the bf16 one
  std::vector<GemmCurve> cpu_gemm;
  std::optional<GpuProfile> gpu;

  // The CPU curve for these activations whose weight size n·k is closest to the asked shape
  // (of equal sizes, the one with the closest n).
  const GemmCurve& curve_for(int64_t n, int64_t k, const std::string& activations) const;
  // Predicted time of one CPU GEMM: the nearest curve's time, scaled by the weight size ratio.
  double gemm_seconds(int64_t m, int64_t n, int64_t k, const std::string& activations) const;
  double gemm_seconds(double m, int64_t n, int64_t k, const std::string& activations) const;
  // The machine's compute ceiling for a GEMM with these activations ("bf16", "f32", or "int8":
  // the int8 GEMM of quantized experts): the instruction peak of the profile's ISA level, or
  // gemm_peak_flops where the profile has none.
  double compute_ceiling_flops(const std::string& activations) const;
};

nlohmann::json to_json(const GemmCurve& c);
// Fails naming `source` and the field when the curve is malformed.
GemmCurve gemm_curve_from_json(const nlohmann::json& j, const std::string& source);
nlohmann::json to_json(const InstructionCeilings& c);
// Fails naming `source` and the field when one is missing or negative.
InstructionCeilings instruction_ceilings_from_json(const nlohmann::json& j,
                                                   const std::string& source);
nlohmann::json to_json(const HardwareProfile& p);
HardwareProfile profile_from_json(const nlohmann::json& j, const std::string& source);

// A profile built from the two quick ceilings (DRAM bandwidth and GEMM peak) when no measured
// profile is cached: GEMM curves follow the plain roofline max(weight bytes / bandwidth,
// FLOPs / peak), except where `small_m` (a bf16 GEMM measured at a few small m) is slower: its
// times, scaled by weight size, hold the losses of small-m GEMMs that the roofline has not.
HardwareProfile quick_profile(double dram_bytes_per_s, double gemm_peak_flops,
                              double call_overhead_seconds = 0,
                              const std::optional<GemmCurve>& small_m = std::nullopt);

}  // namespace sluice
