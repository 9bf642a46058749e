// `sluice profile`: this machine's measured ceilings and kernel curves, cached for the planner.
#include <fmt/format.h>
#include <omp.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/machine_report.h"
#include "runtime/planner/profiler.h"

namespace sluice::cli {
namespace {

struct Options {
  bool refresh = false, json = false;
  int threads = 0;
};

void print_table(const HardwareProfile& p) {
  fmt::print("machine     {} ({} cores, {:.1f} GiB), key {}\n", p.cpu_model, p.cores,
             double(p.memory_bytes) / double(1 << 30), p.machine_key);
  fmt::print("isa level   {}\n", p.isa_level.empty() ? "unknown (an older profile)" : p.isa_level);
  fmt::print("threads     {}\ncache       {}\n\n", p.threads,
             profile_cache_path(this_machine(), p.threads).string());
  fmt::print("instruction peaks at {}, every thread busy (the compute ceilings):\n", p.isa_level);
  print_instruction_ceilings(p.instructions, p.isa_level, "  ");
  fmt::print("\n{:<36} {:>14}\n", "ceiling", "measured");
  fmt::print("{:<36} {:>11.1f} GB/s\n", "DRAM read", p.dram_bytes_per_s / 1e9);
  fmt::print("{:<36} {:>8.1f} GFLOP/s\n", "sluice bf16 GEMM (2048x4096x4096)",
             p.gemm_peak_flops / 1e9);
  for (const QuantGemmSpeedups::Point& q : p.quant_gemm.points)
    fmt::print("{:<36} {:>11.2f}x / {:.2f}x\n",
               fmt::format("int8 / int4 GEMM against bf16 (m={})", q.m), q.int8, q.int4);
  fmt::print("{:<36} {:>11.1f} us\n", "kernel call (1x64x64 GEMM + OpenMP)",
             p.call_overhead_seconds * 1e6);
  if (p.disk_bytes_per_s > 0)
    fmt::print("{:<36} {:>11.2f} GB/s\n", "disk sequential read (O_DIRECT)",
               p.disk_bytes_per_s / 1e9);
  else
    fmt::print("{:<36} {:>14}\n", "disk sequential read (O_DIRECT)", "not measured");
  fmt::print("{:<36} {:>11.1f} GB/s\n", "paged attention, decode (KV read)",
             p.attention_bytes_per_s / 1e9);
  fmt::print("{:<36} {:>8.1f} GFLOP/s\n", "paged attention, prefill", p.attention_flops / 1e9);
  fmt::print("{:<36} {:>11.1f} GB/s\n", "elementwise (SiLU-mul, cache-warm)",
             p.elementwise_bytes_per_s / 1e9);
  // %ceil: of the machine's compute ceiling for these activations; %gemm: of sluice's own
  // large-GEMM rate above.
  for (const GemmCurve& c : p.cpu_gemm) {
    fmt::print("\nGEMM {} {}x{}, {} activations, weights streamed from DRAM\n", c.name, c.n, c.k,
               c.activations);
    fmt::print("{:>6} {:>10} {:>10} {:>7} {:>7} {:>10} {:>7}\n", "m", "ms", "GFLOP/s", "%ceil",
               "%gemm", "W GB/s", "%DRAM");
    const double ceiling = p.compute_ceiling_flops(c.activations);
    for (const auto& pt : c.points) {
      const double flops = 2.0 * double(pt.m) * double(c.n) * double(c.k) / pt.seconds;
      const double wbytes = 2.0 * double(c.n) * double(c.k) / pt.seconds;
      fmt::print("{:>6} {:>10.3f} {:>10.1f} {:>6.0f}% {:>6.0f}% {:>10.1f} {:>6.0f}%\n", pt.m,
                 pt.seconds * 1e3, flops / 1e9, 100 * flops / ceiling,
                 100 * flops / p.gemm_peak_flops, wbytes / 1e9, 100 * wbytes / p.dram_bytes_per_s);
    }
  }
  if (!p.gpu) {
    fmt::print("\nGPU         none (no GPU found, or sluice was built without the CUDA backend)\n");
  } else {
    const GpuProfile& g = *p.gpu;
    fmt::print(
        "\nGPU {}: H2D pinned {:.1f} GB/s, pageable {:.1f} GB/s; D2H pinned {:.1f} GB/s, "
        "pageable {:.1f} GB/s; device memory {:.0f} GB/s; {:.1f} GiB free\n",
        g.name, g.h2d_pinned_bytes_per_s / 1e9, g.h2d_pageable_bytes_per_s / 1e9,
        g.d2h_pinned_bytes_per_s / 1e9, g.d2h_pageable_bytes_per_s / 1e9,
        g.memory_bytes_per_s / 1e9, double(g.memory_free_bytes) / double(1 << 30));
    for (const GemmCurve& c : g.gemm) {
      fmt::print("\nGPU GEMM {} {}x{}, bf16 (cuBLASLt), weights read from device memory\n", c.name,
                 c.n, c.k);
      fmt::print("{:>6} {:>10} {:>10} {:>10}\n", "m", "ms", "TFLOP/s", "W GB/s");
      for (const auto& pt : c.points)
        fmt::print("{:>6} {:>10.4f} {:>10.1f} {:>10.0f}\n", pt.m, pt.seconds * 1e3,
                   2.0 * double(pt.m) * double(c.n) * double(c.k) / pt.seconds / 1e12,
                   2.0 * double(c.n) * double(c.k) / pt.seconds / 1e9);
    }
  }
}

int run(const Options& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  std::optional<HardwareProfile> p = o.refresh ? std::nullopt : load_cached_profile(o.threads);
  if (p && !p->gpu) {
    // Cached before a GPU (or this build's CUDA backend) was there: add the GPU half only.
    if ((p->gpu = measure_gpu())) save_profile(*p);
  }
  if (!p) {
    p = measure_profile([&](const std::string& what) {
      if (!o.json) fmt::print(stderr, "measuring {}...\n", what);
    });
    save_profile(*p);
  }
  if (o.json)
    fmt::print("{}\n", to_json(*p).dump(2));
  else
    print_table(*p);
  return 0;
}

RegisterCommand reg({"profile", "Measure this machine for the planner (cached)", [](CLI::App& sub) {
                       auto o = std::make_shared<Options>();
                       sub.add_flag("--refresh", o->refresh,
                                    "Measure again even if a cached profile exists");
                       sub.add_flag("--json", o->json, "Print the profile as JSON");
                       sub.add_option("--threads", o->threads,
                                      "Measure with this many threads (0: every core)")
                           ->check(CLI::NonNegativeNumber);
                       return std::function<int()>([o] { return run(*o); });
                     }});

}  // namespace
}  // namespace sluice::cli
