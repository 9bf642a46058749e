// `sluice bench-kernels`: measured ceilings of this machine at the ISA level in force (the
// instruction peaks with every thread busy, DRAM read bandwidth) and the CPU kernels' achieved
// rates as fractions of them.
#include <fmt/format.h>
#include <omp.h>

#include <memory>
#include <vector>

#include "cli/command.h"
#include "cli/machine_report.h"
#include "kernels/cpu/bench.h"
#include "kernels/cpu/gemm_int8.h"
#include "kernels/cpu/isa.h"
#include "runtime/hardware_probe.h"

namespace {

struct Options {
  int64_t n = 14336, k = 4096;  // Mixtral expert w1/w3 shape
  // Rows of X in the bf16 GEMM table.
  std::vector<int64_t> ms = {1, 4, 8, 16, 32, 64, 256, 1024};
  // Rows of X in the int8 and int4 GEMM tables.
  std::vector<int64_t> int8_ms = {1, 4, 16, 64, 256};
  bool skip_gemm = false, skip_attention = false;
  bool skip_int8 = false;
  int64_t int8_group = 128;
};

// Roofline of Y[m,n] = X[m,k]·Wᵀ with W bf16: 2·m·n·k FLOPs on 2·n·k weight bytes, so m FLOP per
// byte; below m = bf16 ceiling / DRAM bandwidth (≈ 7 on a 2-core AVX2 EPYC: 193 GFLOP/s over
// 28 GB/s) it is bound by the weight reads (%dram is the figure to watch), above it by the
// level's bf16 instruction (%ceil). %gemm is against sluice's own large-GEMM rate. %dram is
// against "read GB/s": a plain read of another copy of the weights, timed right after each call
// (KernelTiming::read_seconds), since this VM's DRAM bandwidth moves within the run.
void print_gemm_table(const Options& o, const sluice::InstructionCeilings& ceilings) {
  using namespace sluice;
  const double gemm_peak = measure_gemm_peak();
  fmt::print("sluice bf16 GEMM (2048x4096x4096): {:.1f} GFLOP/s = {:.0f}% of the bf16 ceiling\n",
             gemm_peak / 1e9, 100 * gemm_peak / ceilings.bf16_flops);
  fmt::print("\nGEMM n={} k={} (W bf16 [n,k]), X bf16; ceiling {:.1f} GFLOP/s ({}):\n", o.n, o.k,
             ceilings.bf16_flops / 1e9, ceilings.bf16_instruction);
  fmt::print("{:>6} {:>10} {:>12} {:>7} {:>7} {:>12} {:>9} {:>7} {:>12}\n", "m", "ms", "GFLOP/s",
             "%ceil", "%gemm", "W GB/s", "read GB/s", "%dram", "runtime-m ms");
  for (int64_t m : o.ms) {
    auto t = cpu::bench_gemm(m, o.n, o.k, DType::BF16, cpu::GemmRowMode::kExact);
    auto r = cpu::bench_gemm(m, o.n, o.k, DType::BF16, cpu::GemmRowMode::kRuntime);
    fmt::print(
        "{:>6} {:>10.3f} {:>12.1f} {:>6.1f}% {:>6.1f}% {:>12.1f} {:>9.1f} {:>6.1f}% {:>12.3f}\n", m,
        t.seconds * 1e3, t.flop_rate() / 1e9, 100 * t.flop_rate() / ceilings.bf16_flops,
        100 * t.flop_rate() / gemm_peak, t.byte_rate() / 1e9, t.read_rate() / 1e9,
        100 * t.byte_rate() / t.read_rate(), r.seconds * 1e3);
  }
}

// The int8 expert GEMM (gemm_int8, W int8 with fp32 group scales, X fp32 quantized on the fly)
// at the current ISA level: n·k + 4·n·k/group bytes of W for 2·m·n·k OP, so about 2·m OP per
// byte; below m ≈ int8 ceiling / (2 · DRAM) (≈ 6 on a 2-core AVX2 EPYC) it should read W at
// DRAM speed (%dram), above it approach the level's int8 instruction peak (%ceil).
// int4 (the same GEMM on nibbles unpacked in registers) halves the weight bytes again: about
// 4·m OP per byte, so DRAM-bound only below half int8's m, and the unpacking (and, on vpdpbusd,
// two dot products per 64-byte line) costs instructions, so its compute ceiling is the same
// int8 one.
void print_int8_gemm(const Options& o, const sluice::InstructionCeilings& ceilings,
                     sluice::cpu::QuantFormat format) {
  using namespace sluice;
  fmt::print("\n{} GEMM n={} k={} group={} ({}), X fp32; ceiling {:.1f} GOP/s ({}):\n",
             cpu::quant_format_name(format), o.n, o.k, o.int8_group,
             cpu::int8_dot_name(cpu::gemm_int8_dot()), ceilings.int8_ops / 1e9,
             ceilings.int8_instruction);
  fmt::print("{:>6} {:>10} {:>12} {:>7} {:>12} {:>9} {:>7}\n", "m", "ms", "GOP/s", "%ceil", "GB/s",
             "read GB/s", "%dram");
  for (int64_t m : o.int8_ms) {
    auto t = cpu::bench_gemm_int8(m, o.n, o.k, o.int8_group, 0.2, format);
    fmt::print("{:>6} {:>10.3f} {:>12.1f} {:>6.1f}% {:>12.1f} {:>9.1f} {:>6.1f}%\n", m,
               t.seconds * 1e3, t.flop_rate() / 1e9, 100 * t.flop_rate() / ceilings.int8_ops,
               t.byte_rate() / 1e9, t.read_rate() / 1e9, 100 * t.byte_rate() / t.read_rate());
  }
}

int run(const Options& o) {
  using namespace sluice;
  fmt::print("machine {}, {} threads\n", cli::machine_description(), omp_get_max_threads());
  const double dram = measure_dram_bandwidth();
  const InstructionCeilings ceilings = measure_instruction_ceilings();
  fmt::print("DRAM read bandwidth: {:.1f} GB/s\n", dram / 1e9);
  const std::string level = cpu::isa_name(cpu::isa_level());
  fmt::print("instruction peaks at {}, every thread busy:\n", level);
  cli::print_instruction_ceilings(ceilings, level, "  ");
  if (!o.skip_gemm) print_gemm_table(o, ceilings);
  if (!o.skip_int8) {
    print_int8_gemm(o, ceilings, cpu::QuantFormat::kInt8);
    print_int8_gemm(o, ceilings, cpu::QuantFormat::kInt4);
  }
  if (!o.skip_attention) {
    fmt::print("\nPaged attention, 128 sequences, heads 32, kv_heads 8, head_dim 128, bs 16:\n");
    // Decode attention reads K and V once for 4 FLOP per element and query head group: bound
    // by DRAM (%dram); prefill chunks reuse them n_q times, so %fma (of the fp32 FMA peak, the
    // instruction attention's fp32 arithmetic issues) becomes the figure to watch.
    fmt::print("{:>8} {:>5} {:>10} {:>10} {:>8} {:>10} {:>7}\n", "context", "n_q", "ms", "KV GB/s",
               "%dram", "GFLOP/s", "%fma");
    for (auto [context, n_q] : {std::pair{1024, 1}, {4096, 1}, {1024, 16}}) {
      cpu::AttentionBenchShape shape;
      shape.context = context;
      shape.n_q = n_q;
      shape.batch = context >= 4096 ? 32 : 128;
      auto t = cpu::bench_attention(shape);
      fmt::print("{:>8} {:>5} {:>10.3f} {:>10.1f} {:>7.1f}% {:>10.1f} {:>6.1f}%\n", context, n_q,
                 t.seconds * 1e3, t.byte_rate() / 1e9, 100 * t.byte_rate() / dram,
                 t.flop_rate() / 1e9, 100 * t.flop_rate() / ceilings.fp32_fma_flops);
    }
  }
  return 0;
}

sluice::cli::RegisterCommand reg(
    {"bench-kernels",
     "Measure DRAM bandwidth, instruction peaks and CPU kernel "
     "throughput",
     [](CLI::App& sub) {
       auto o = std::make_shared<Options>();
       sub.add_option("--gemm-n", o->n, "GEMM output features");
       sub.add_option("--gemm-k", o->k, "GEMM input features");
       sub.add_option("--gemm-m", o->ms, "rows of X in the bf16 GEMM table, e.g. 16,64")
           ->delimiter(',')
           ->check(CLI::PositiveNumber);
       sub.add_option("--int8-m", o->int8_ms, "rows of X in the int8 and int4 GEMM tables")
           ->delimiter(',')
           ->check(CLI::PositiveNumber);
       sub.add_flag("--skip-gemm", o->skip_gemm);
       sub.add_flag("--skip-attention", o->skip_attention);
       sub.add_flag("--skip-int8", o->skip_int8);
       sub.add_option("--int8-group", o->int8_group, "int8/int4 GEMM scale group size");
       return std::function<int()>([o] { return run(*o); });
     }});

}  // namespace
