#include "engine/throughput_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "core/units.h"
#include "runtime/hardware_probe.h"
#include "runtime/planner/hardware_profile.h"

namespace sluice {

Ceilings measure_ceilings() {
  static Ceilings measured;
  static std::once_flag once;
  std::call_once(once, [] {
    measured.dram_bytes_per_s = measure_dram_bandwidth();
    measured.gemm_flops = measure_gemm_peak();
    measured.call_seconds = measure_call_overhead();
    measured.instructions = measure_instruction_ceilings();
  });
  return measured;
}

double Ceilings::compute_flops(Precision precision) const {
  if (!instructions.measured()) return gemm_flops;
  return precision == Precision::kF32 ? instructions.fp32_fma_flops : instructions.bf16_flops;
}

const std::string& Ceilings::compute_instruction(Precision precision) const {
  return precision == Precision::kF32 ? instructions.fp32_instruction
                                      : instructions.bf16_instruction;
}

double Ceilings::expert_flops(Precision precision, ExpertDtype experts) const {
  if (experts == ExpertDtype::kBf16 || !instructions.measured()) return compute_flops(precision);
  return instructions.int8_ops;
}

const std::string& Ceilings::expert_instruction(Precision precision, ExpertDtype experts) const {
  if (experts == ExpertDtype::kBf16 || !instructions.measured())
    return compute_instruction(precision);
  return instructions.int8_instruction;
}

ThroughputReport summarize(const EngineStats& s, double wall, int64_t prompt_tokens,
                           int64_t generated, const Ceilings& c, Precision precision,
                           ExpertDtype experts) {
  ThroughputReport r;
  r.wall_seconds = wall;
  r.prompt_tokens = prompt_tokens;
  r.generated_tokens = generated;
  r.prefill_tokens_per_s = s.prefill_seconds > 0 ? s.prefill_tokens / s.prefill_seconds : 0;
  r.decode_tokens_per_s = s.decode_seconds > 0 ? s.decode_tokens / s.decode_seconds : 0;
  r.total_tokens_per_s = double(prompt_tokens + generated) / wall;
  const double bytes = s.weight_bytes + s.kv_bytes;
  r.bytes_per_s = bytes / wall;
  r.flops_per_s = s.flops / wall;
  r.fraction_of_dram = r.bytes_per_s / c.dram_bytes_per_s;
  r.fraction_of_gemm_peak = r.flops_per_s / c.gemm_flops;
  r.compute_ceiling_flops = c.compute_flops(precision);
  r.compute_ceiling_instruction = c.compute_instruction(precision);
  r.expert_ceiling_flops = c.expert_flops(precision, experts);
  r.expert_ceiling_instruction = c.expert_instruction(precision, experts);
  // The time `flops` take at the ceilings, `expert_flops` of them at the experts' own.
  auto compute_seconds = [&](double flops, double expert_flops) {
    return (flops - expert_flops) / r.compute_ceiling_flops +
           expert_flops / r.expert_ceiling_flops;
  };
  r.fraction_of_compute_ceiling = compute_seconds(s.flops, s.expert_flops) / wall;
  auto bound = [&](double b, double flops, double expert_flops) {
    return std::max(b / c.dram_bytes_per_s, compute_seconds(flops, expert_flops));
  };
  r.roofline_seconds = bound(bytes, s.flops, s.expert_flops);
  r.fraction_of_roofline = r.roofline_seconds / wall;
  const double prefill_step_seconds = s.prompt_step_seconds();
  if (s.decode_only_seconds > 0)
    r.decode_fraction_of_roofline =
        bound(s.decode_only_bytes, s.decode_only_flops, s.decode_only_expert_flops) /
        s.decode_only_seconds;
  if (prefill_step_seconds > 0)
    r.prefill_fraction_of_roofline =
        bound(bytes - s.decode_only_bytes, s.flops - s.decode_only_flops,
              s.expert_flops - s.decode_only_expert_flops) /
        prefill_step_seconds;
  r.expert_gemm_flops = s.expert_gemm_seconds > 0 ? s.expert_flops / s.expert_gemm_seconds : 0;
  r.expert_gemm_fraction_of_peak = r.expert_gemm_flops / c.gemm_flops;
  r.expert_gemm_fraction_of_ceiling = r.expert_gemm_flops / r.expert_ceiling_flops;
  r.tokens_per_expert_gemm =
      double(s.expert_tokens) / double(std::max<int64_t>(1, s.expert_gemm_calls));
  return r;
}

void print_report(const ThroughputReport& r, const EngineStats& s, const Ceilings& c) {
  fmt::print("prefill    {:9.1f} tokens/s   ({} tokens)\n", r.prefill_tokens_per_s,
             s.prefill_tokens);
  fmt::print("decode     {:9.1f} tokens/s   ({} tokens)\n", r.decode_tokens_per_s, s.decode_tokens);
  fmt::print("end to end {:9.1f} tokens/s   ({} prompt + {} generated in {:.2f} s, {} steps)\n",
             r.total_tokens_per_s, r.prompt_tokens, r.generated_tokens, r.wall_seconds, s.steps);
  const double stages = s.attention_seconds + s.expert_seconds + s.dense_seconds +
                        s.sampling_seconds + s.scheduling_seconds;
  fmt::print("\ntime by stage\n");
  const std::pair<const char*, double> rows[] = {
      {"experts (gather, GEMMs, SiLU, scatter)", s.expert_seconds},
      {"dense (norms, QKV, O, router, lm_head)", s.dense_seconds},
      {"attention (RoPE, KV write, attention)", s.attention_seconds},
      {"sampling", s.sampling_seconds},
      {"scheduling", s.scheduling_seconds}};
  for (auto [name, sec] : rows)
    fmt::print("  {:<40} {:8.3f} s  {:5.1f}%\n", name, sec, 100 * sec / stages);
  if (r.offloaded) {
    fmt::print(
        "\nroofline   the offload device did the GEMMs, so the host's DRAM and compute ceilings "
        "bound only the CPU's part of the run: the link's bounds are under `device` below\n");
    return;
  }
  fmt::print(
      "\nmoved      {:.2f} GB/s = {:.0f}% of DRAM bandwidth {:.1f} GB/s (weights {}, KV {})\n",
      r.bytes_per_s / 1e9, 100 * r.fraction_of_dram, c.dram_bytes_per_s / 1e9,
      human_bytes(s.weight_bytes), human_bytes(s.kv_bytes));
  const bool own_expert_ceiling = r.expert_ceiling_instruction != r.compute_ceiling_instruction;
  const std::string expert_ceiling =
      own_expert_ceiling ? fmt::format("the experts' ceiling {:.1f} GOP/s ({})",
                                       r.expert_ceiling_flops / 1e9, r.expert_ceiling_instruction)
                         : std::string("the compute ceiling");
  fmt::print(
      "computed   {:.1f} GFLOP/s = {:.0f}% of the compute ceiling {:.1f} GFLOP/s ({}){}, {:.0f}% "
      "of sluice's GEMM peak {:.1f} GFLOP/s\n",
      r.flops_per_s / 1e9, 100 * r.fraction_of_compute_ceiling, r.compute_ceiling_flops / 1e9,
      r.compute_ceiling_instruction.empty() ? "the GEMM peak: no instruction peaks measured"
                                            : r.compute_ceiling_instruction,
      own_expert_ceiling ? " and " + expert_ceiling + " for the experts" : "",
      100 * r.fraction_of_gemm_peak, c.gemm_flops / 1e9);
  fmt::print(
      "experts    {:.1f} GFLOP/s inside their GEMMs = {:.0f}% of {}, {:.0f}% of sluice's bf16 "
      "GEMM peak, {:.1f} tokens per expert GEMM\n",
      r.expert_gemm_flops / 1e9, 100 * r.expert_gemm_fraction_of_ceiling, expert_ceiling,
      100 * r.expert_gemm_fraction_of_peak, r.tokens_per_expert_gemm);
  fmt::print(
      "roofline   the work done bounds the run at {:.2f} s (DRAM bandwidth and the compute "
      "ceiling): {:.0f}% of roofline\n",
      r.roofline_seconds, 100 * r.fraction_of_roofline);
  fmt::print(
      "           steps with prompt tokens {:.0f}% of their roofline, decode-only steps {:.0f}%\n",
      100 * r.prefill_fraction_of_roofline, 100 * r.decode_fraction_of_roofline);
}

nlohmann::json report_json(const ThroughputReport& r, const EngineStats& s, const Ceilings& c) {
  nlohmann::json j = {{"prefill_tokens_per_s", r.prefill_tokens_per_s},
                      {"decode_tokens_per_s", r.decode_tokens_per_s},
                      {"total_tokens_per_s", r.total_tokens_per_s},
                      {"prompt_tokens", r.prompt_tokens},
                      {"generated_tokens", r.generated_tokens},
                      {"wall_seconds", r.wall_seconds},
                      {"steps", s.steps},
                      {"dram_bytes_per_s", c.dram_bytes_per_s},
                      {"gemm_peak_flops", c.gemm_flops},
                      {"compute_ceiling_flops", r.compute_ceiling_flops},
                      {"compute_ceiling_instruction", r.compute_ceiling_instruction},
                      {"expert_ceiling_flops", r.expert_ceiling_flops},
                      {"expert_ceiling_instruction", r.expert_ceiling_instruction},
                      {"instruction_ceilings", to_json(c.instructions)},
                      {"achieved_bytes_per_s", r.bytes_per_s},
                      {"achieved_flops", r.flops_per_s},
                      {"expert_gemm_flops", r.expert_gemm_flops},
                      {"tokens_per_expert_gemm", r.tokens_per_expert_gemm},
                      {"stage_seconds",
                       {{"attention", s.attention_seconds},
                        {"experts", s.expert_seconds},
                        {"expert_gemms", s.expert_gemm_seconds},
                        {"dense", s.dense_seconds},
                        {"sampling", s.sampling_seconds},
                        {"scheduling", s.scheduling_seconds}}},
                      {"kv_cache_bytes", s.kv_cache_bytes},
                      {"peak_kv_usage", s.peak_kv_usage}};
  if (!r.offloaded)  // the figures measured against the host's ceilings (throughput_report.h)
    j.update({{"fraction_of_roofline", r.fraction_of_roofline},
              {"roofline_seconds", r.roofline_seconds},
              {"prefill_fraction_of_roofline", r.prefill_fraction_of_roofline},
              {"decode_fraction_of_roofline", r.decode_fraction_of_roofline},
              {"fraction_of_compute_ceiling", r.fraction_of_compute_ceiling},
              {"expert_gemm_fraction_of_ceiling", r.expert_gemm_fraction_of_ceiling},
              {"fraction_of_dram", r.fraction_of_dram},
              {"fraction_of_gemm_peak", r.fraction_of_gemm_peak},
              {"expert_gemm_fraction_of_peak", r.expert_gemm_fraction_of_peak}});
  return j;
}

}  // namespace sluice
