// `sluice bench-kernels`: measured ceilings of this machine and the CPU kernels' achieved rates
// as fractions of them.
#include <fmt/format.h>

#include <memory>

#include "cli/command.h"
#include "kernels/cpu/bench.h"
#include "kernels/cpu/gemm_int8.h"
#include "runtime/hardware_probe.h"

namespace {

struct Options {
  int64_t n = 14336, k = 4096;  // Mixtral expert w1/w3 shape
  bool skip_gemm = false, skip_attention = false;
  bool skip_int8 = false;
  int64_t int8_group = 128;
};

// The int8 expert GEMM (gemm_int8, W int8 with fp32 group scales, X fp32 quantized on the fly)
// at the current ISA level: below m ≈ 8 it should read W at DRAM speed, above it approach the
// int8 instruction's peak.
void print_int8_gemm(const Options& o, double dram) {
  using namespace sluice;
  fmt::print("\nint8 GEMM n={} k={} group={} ({}), X fp32:\n", o.n, o.k, o.int8_group,
             cpu::int8_dot_name(cpu::gemm_int8_dot()));
  fmt::print("{:>6} {:>10} {:>12} {:>12} {:>8}\n", "m", "ms", "GOP/s", "GB/s", "%dram");
  for (int64_t m : {1, 4, 16, 64, 256}) {
    auto t = cpu::bench_gemm_int8(m, o.n, o.k, o.int8_group);
    fmt::print("{:>6} {:>10.3f} {:>12.1f} {:>12.1f} {:>7.1f}%\n", m, t.seconds * 1e3,
               t.flop_rate() / 1e9, t.byte_rate() / 1e9, 100 * t.byte_rate() / dram);
  }
}

int run(const Options& o) {
  using namespace sluice;
  const double dram = measure_dram_bandwidth();
  const double peak = measure_gemm_peak();
  fmt::print("DRAM read bandwidth: {:.1f} GB/s\n", dram / 1e9);
  fmt::print("bf16 GEMM peak (2048x4096x4096): {:.1f} GFLOP/s\n", peak / 1e9);
  if (!o.skip_gemm) {
    fmt::print("\nGEMM n={} k={} (W bf16 [n,k]), X bf16:\n", o.n, o.k);
    fmt::print("{:>6} {:>10} {:>12} {:>8} {:>12} {:>8} {:>12}\n", "m", "ms", "GFLOP/s", "%peak",
               "W GB/s", "%dram", "runtime-m ms");
    for (int64_t m : {1, 8, 32, 128, 512, 2048}) {
      auto t = cpu::bench_gemm(m, o.n, o.k, DType::BF16, cpu::GemmRowMode::kExact);
      auto r = cpu::bench_gemm(m, o.n, o.k, DType::BF16, cpu::GemmRowMode::kRuntime);
      fmt::print("{:>6} {:>10.3f} {:>12.1f} {:>7.1f}% {:>12.1f} {:>7.1f}% {:>12.3f}\n", m,
                 t.seconds * 1e3, t.flop_rate() / 1e9, 100 * t.flop_rate() / peak,
                 t.byte_rate() / 1e9, 100 * t.byte_rate() / dram, r.seconds * 1e3);
    }
  }
  if (!o.skip_int8) print_int8_gemm(o, dram);
  if (!o.skip_attention) {
    fmt::print("\nPaged attention, 128 sequences, heads 32, kv_heads 8, head_dim 128, bs 16:\n");
    fmt::print("{:>8} {:>5} {:>10} {:>10} {:>8} {:>10}\n", "context", "n_q", "ms", "KV GB/s",
               "%dram", "GFLOP/s");
    for (auto [context, n_q] : {std::pair{1024, 1}, {4096, 1}, {1024, 16}}) {
      cpu::AttentionBenchShape shape;
      shape.context = context;
      shape.n_q = n_q;
      shape.batch = context >= 4096 ? 32 : 128;
      auto t = cpu::bench_attention(shape);
      fmt::print("{:>8} {:>5} {:>10.3f} {:>10.1f} {:>7.1f}% {:>10.1f}\n", context, n_q,
                 t.seconds * 1e3, t.byte_rate() / 1e9, 100 * t.byte_rate() / dram,
                 t.flop_rate() / 1e9);
    }
  }
  return 0;
}

sluice::cli::RegisterCommand reg({"bench-kernels",
                                  "Measure DRAM bandwidth, GEMM peak and CPU kernel throughput",
                                  [](CLI::App& sub) {
                                    auto o = std::make_shared<Options>();
                                    sub.add_option("--gemm-n", o->n, "GEMM output features");
                                    sub.add_option("--gemm-k", o->k, "GEMM input features");
                                    sub.add_flag("--skip-gemm", o->skip_gemm);
                                    sub.add_flag("--skip-attention", o->skip_attention);
                                    sub.add_flag("--skip-int8", o->skip_int8);
                                    sub.add_option("--int8-group", o->int8_group,
                                                   "int8 GEMM scale group size");
                                    return std::function<int()>([o] { return run(*o); });
                                  }});

}  // namespace
