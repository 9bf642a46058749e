// Turns an engine run's statistics into the figures sluice prints: tokens per second, bytes and
// FLOPs per second, and each as a fraction of this machine's measured ceilings.
//
// Roofline: work that reads `bytes` (weights and KV) and does `flops` cannot finish faster than
// max(bytes / DRAM bandwidth, flops / compute ceiling), where the compute ceiling is the
// machine's instruction peak at the ISA level in force (the bf16 dot product, or the fp32 FMA
// where the level has none), not sluice's own best GEMM; with int8 or int4 experts their GEMMs'
// operations count against the int8 dot product's peak instead (vpdpbusd, vpmaddubsw, ...), the
// rest against the bf16 one. fraction_of_roofline is that bound divided by the measured time: 1.0
// means the run went as fast as the machine allows.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/batch_engine.h"
#include "runtime/hardware_probe.h"
#include "runtime/policy.h"

namespace sluice {

struct Ceilings {
  double dram_bytes_per_s = 0;       // measured streaming read bandwidth
  double gemm_flops = 0;             // measured large bf16 GEMM throughput (cpu::gemm)
  double call_seconds = 0;           // measured overhead of one kernel call
  InstructionCeilings instructions;  // the ISA level's instruction peaks

  // The machine's compute ceiling for GEMMs at this precision: the instruction peak, or the
  // measured GEMM where the instruction peaks are missing.
  double compute_flops(Precision precision) const;
  const std::string& compute_instruction(Precision precision) const;
  // The ceiling of the expert GEMMs: the int8 dot product's with quantized experts (where the
  // instruction peaks were measured), else compute_flops.
  double expert_flops(Precision precision, ExpertDtype experts) const;
  const std::string& expert_instruction(Precision precision, ExpertDtype experts) const;
};
Ceilings measure_ceilings();  // a few seconds; measured once per process

struct ThroughputReport {
  double wall_seconds = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_tokens_per_s = 0, decode_tokens_per_s = 0, total_tokens_per_s = 0;
  double bytes_per_s = 0, flops_per_s = 0;
  double fraction_of_dram = 0, fraction_of_gemm_peak = 0;
  // fraction_of_compute_ceiling: the time the flops take at the ceilings (the experts' at
  // theirs), over the wall time.
  double compute_ceiling_flops = 0, fraction_of_compute_ceiling = 0;
  std::string compute_ceiling_instruction;  // "" where the GEMM peak stands in for it
  double expert_ceiling_flops = 0;          // int8 OP/s with quantized experts
  std::string expert_ceiling_instruction;
  double roofline_seconds = 0, fraction_of_roofline = 0;
  // The same bound over the steps without prompt tokens (decode) and over the others (prefill,
  // with any decode tokens that rode along); 0 where there were none.
  double decode_fraction_of_roofline = 0, prefill_fraction_of_roofline = 0;
  double expert_gemm_flops = 0, expert_gemm_fraction_of_peak = 0;
  double expert_gemm_fraction_of_ceiling = 0;
  double tokens_per_expert_gemm = 0;
  // Set where an offload device did the GEMMs (and a share of attention): the host's DRAM and
  // compute ceilings then bound only the CPU's part, so the figures above measured against them
  // (fractions of DRAM, of the compute ceiling, of the roofline) are neither printed nor put in
  // the JSON; the device report's link bounds stand in their place.
  bool offloaded = false;
};

// `precision` chooses the compute ceiling: bf16 activations are bound by the level's bf16
// ceiling, fp32 ones by its fp32 FMA; `experts` the expert GEMMs' (int8 for int8 and int4).
ThroughputReport summarize(const EngineStats& s, double wall_seconds, int64_t prompt_tokens,
                           int64_t generated_tokens, const Ceilings& ceilings,
                           Precision precision = Precision::kBf16,
                           ExpertDtype experts = ExpertDtype::kBf16);

// The multi-line human report of `sluice bench` (throughput, stages, bytes, FLOPs, roofline).
void print_report(const ThroughputReport& r, const EngineStats& s, const Ceilings& c);
nlohmann::json report_json(const ThroughputReport& r, const EngineStats& s, const Ceilings& c);

}  // namespace sluice
