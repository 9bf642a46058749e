// Short measurements of this machine's ceilings, used by the planner (HRM) and to print every
// speed figure as a fraction of what the hardware actually achieved. Each takes well under 2 s.
#pragma once

#include <string>

namespace sluice {

// The compute ceilings of the ISA level in force (kernels/cpu/peaks.h): the rate of the
// instruction each GEMM kind's inner loop issues, with every OpenMP thread busy, and its name.
// All 0 where not measured (profiles written before they existed).
struct InstructionCeilings {
  double fp32_fma_flops = 0;  // the level's fp32 FMA: GEMMs with fp32 activations (gemm_f32)
  double bf16_flops = 0;      // bf16 GEMMs: the fp32 FMA again below avx512bf16 (no bf16 op)
  double int8_ops = 0;        // int8 GEMMs, OP/s: vpmaddubsw, AVX-VNNI, AVX512-VNNI or AMX
  std::string fp32_instruction, bf16_instruction, int8_instruction;

  bool measured() const { return fp32_fma_flops > 0 && bf16_flops > 0 && int8_ops > 0; }
};

// About 0.3-0.8 s: each peak is a short loop on every OpenMP thread.
InstructionCeilings measure_instruction_ceilings();

// Achieved FLOP/s of one large bf16 GEMM through cpu::gemm (n=k=4096, bf16 activations, all
// OpenMP threads; m=2048, or the rows that run in about 0.2 s at a slow ISA level): the compute
// ceiling of expert GEMMs on this CPU.
double measure_gemm_peak();

// Achieved bytes/s of a streaming read, by all OpenMP threads, of a buffer several times larger
// than the last-level cache: the ceiling for weight and KV-cache reads from host DRAM.
double measure_dram_bandwidth();

// Seconds of one engine kernel call doing almost nothing: the median over many back-to-back
// rounds of a 1×64×64 GEMM through cpu::gemm plus one entry into the OpenMP pool. A step of a
// small model is hundreds of such calls, so this floor is what its time is made of.
double measure_call_overhead();

}  // namespace sluice
