// Turns an engine run's statistics into the figures sluice prints: tokens per second, bytes and
// FLOPs per second, and each as a fraction of this machine's measured ceilings.
//
// Roofline: work that reads `bytes` (weights and KV) and does `flops` cannot finish faster than
// max(bytes / DRAM bandwidth, flops / GEMM peak). fraction_of_roofline is that bound divided by
// the measured time: 1.0 means the run went as fast as the machine's ceilings allow.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/batch_engine.h"

namespace sluice {

struct Ceilings {
  double dram_bytes_per_s = 0;  // measured streaming read bandwidth
  double gemm_flops = 0;        // measured large bf16 GEMM throughput
  double call_seconds = 0;      // measured overhead of one kernel call
};
Ceilings measure_ceilings();  // a few seconds; measured once per process

struct ThroughputReport {
  double wall_seconds = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_tokens_per_s = 0, decode_tokens_per_s = 0, total_tokens_per_s = 0;
  double bytes_per_s = 0, flops_per_s = 0;
  double fraction_of_dram = 0, fraction_of_gemm_peak = 0;
  double roofline_seconds = 0, fraction_of_roofline = 0;
  double expert_gemm_flops = 0, expert_gemm_fraction_of_peak = 0;
  double tokens_per_expert_gemm = 0;
};

ThroughputReport summarize(const EngineStats& s, double wall_seconds, int64_t prompt_tokens,
                           int64_t generated_tokens, const Ceilings& ceilings);

// The multi-line human report of `sluice bench` (throughput, stages, bytes, FLOPs, roofline).
void print_report(const ThroughputReport& r, const EngineStats& s, const Ceilings& c);
nlohmann::json report_json(const ThroughputReport& r, const EngineStats& s, const Ceilings& c);

}  // namespace sluice
