// Short measurements of this machine's ceilings, used by the planner (HRM) and to print every
// speed figure as a fraction of what the hardware actually achieved. Each takes well under 2 s.
#pragma once

namespace sluice {

// Achieved FLOP/s of one large bf16 GEMM through cpu::gemm (m=2048, n=k=4096, bf16 activations,
// all OpenMP threads): the compute ceiling of expert GEMMs on this CPU.
double measure_gemm_peak();

// Achieved bytes/s of a streaming read, by all OpenMP threads, of a buffer several times larger
// than the last-level cache: the ceiling for weight and KV-cache reads from host DRAM.
double measure_dram_bandwidth();

// Seconds of one engine kernel call doing almost nothing: the median over many back-to-back
// rounds of a 1×64×64 GEMM through cpu::gemm plus one entry into the OpenMP pool. A step of a
// small model is hundreds of such calls, so this floor is what its time is made of.
double measure_call_overhead();

}  // namespace sluice
