// Timing of the CPU kernels for benchmarks and the planner's calibration: each function runs the
// kernel on synthetic data until both a minimum repeat count and a minimum time are reached, and
// returns the best time per call together with the FLOPs and bytes that call must move, so the
// caller can print achieved FLOP/s and bytes/s against the measured ceilings.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/gemm_int8.h"
#include "kernels/cpu/gemm.h"

namespace sluice::cpu {

struct KernelTiming {
  double seconds = 0;  // best wall time of one call
  double flops = 0;    // arithmetic of one call
  double bytes = 0;    // compulsory memory traffic of one call (each operand once)
  // The GEMM benchmarks also time a plain read (read_stream) of another copy of the weights
  // right after each call: its best time and the bytes it read. On a shared VM the DRAM
  // bandwidth moves by 2× within minutes, so the weight bandwidth is compared with this read of
  // the same bytes in the same seconds rather than with a probe taken earlier.
  double read_seconds = 0;
  double read_bytes = 0;
  double flop_rate() const { return flops / seconds; }
  double byte_rate() const { return bytes / seconds; }
  double read_rate() const { return read_bytes / read_seconds; }
};

// Y[m,n] = X[m,k]·Wᵀ with W bf16 [n,k]. Bytes: W once (2·n·k), X once, Y written once (4·m·n).
KernelTiming bench_gemm(int64_t m, int64_t n, int64_t k, DType x_dtype, GemmRowMode mode,
                        double min_seconds = 0.2);

// Y[m,n] = X[m,k]·Wᵀ with W int8 (or int4) [n,k] and fp32 scales per `group_size` k
// (gemm_int8), X fp32. Bytes: W once (its packed bytes: n·k or n·k/2, plus 4·n·k/group_size),
// X once (4·m·k), Y written once (4·m·n). The FLOPs are int8 multiply-adds counted as 2
// operations each.
KernelTiming bench_gemm_int8(int64_t m, int64_t n, int64_t k, int64_t group_size,
                             double min_seconds = 0.2,
                             QuantFormat format = QuantFormat::kInt8);

struct AttentionBenchShape {
  int batch = 128;     // sequences decoded together
  int context = 1024;  // KV length of each sequence
  int n_q = 1;         // new tokens per sequence (1: decode)
  int heads = 32, kv_heads = 8, head_dim = 128;
  int block_size = 16;
};
// Batched paged attention. Bytes: the K and V of every sequence once (bf16).
KernelTiming bench_attention(const AttentionBenchShape& shape, double min_seconds = 0.2);

}  // namespace sluice::cpu
