// sluice bench: throughput of the batch engine on synthetic prompts, with the time split by
// stage and every rate shown as a fraction of this machine's measured ceilings.
//
// Roofline arithmetic (printed figures are computed the same way): a step that reads `bytes`
// of weights and KV and does `flops` cannot take less than max(bytes / DRAM bandwidth,
// flops / GEMM peak); fraction_of_roofline is that bound over the measured time. For the
// Mixtral-8x7B shape a decode step over B sequences reads each layer's 8 experts (8 × 3 ×
// 4096 × 14336 × 2 B = 2.8 GB) once while doing 2 × 3 × 4096 × 14336 × 2 flops per token per
// layer, so per layer ~2.8 GB / 15 GB/s ≈ 190 ms bounds the step until B·k/E tokens per expert
// make the GEMMs compute bound (B ≈ 8 · 15e9 / (2 × 2 × 1e12 / 1e0) … see bench/RESULTS.md).
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <chrono>
#include <memory>
#include <random>

#include "cli/command.h"
#include "cli/policy_options.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/batch_engine.h"
#include "model/model_stats.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/hardware_probe.h"
#include "runtime/memory_info.h"

namespace sluice::cli {
namespace {

struct Options {
  std::string model_dir, preset;
  int layers = 0;
  int prompt_len = 128, gen_len = 32, requests = 64;
  bool ignore_eos = false, json = false;
  uint64_t seed = 0;
  std::string kv_memory;
  Policy policy;
};

int run(Options o) {
  if (o.model_dir.empty() == o.preset.empty()) fail("bench: give exactly one of --model or --preset");
  if (o.policy.threads > 0) omp_set_num_threads(o.policy.threads);
  auto t_load = std::chrono::steady_clock::now();
  Model model = o.preset.empty() ? load_model(o.model_dir)
                                 : make_random_model(preset_config(o.preset, o.layers), o.seed);
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const ModelConfig& c = model.config;
  const ModelStats ms = model_stats(model);

  const double dram = measure_dram_bandwidth();
  const double peak = measure_gemm_peak();

  WorkloadShape shape{o.requests, o.prompt_len, o.gen_len};
  const size_t kv_budget = o.kv_memory.empty() ? available_memory_bytes() / 2
                                               : parse_bytes(o.kv_memory, "--kv-memory");
  Policy policy = resolve_policy(o.policy, c, shape, kv_budget);
  omp_set_num_threads(policy.threads);

  std::mt19937 rng(uint32_t(o.seed));
  std::uniform_int_distribution<int> token(3, c.vocab_size - 1);
  std::vector<Request> requests;
  for (int i = 0; i < o.requests; ++i) {
    Request r;
    r.id = i;
    for (int t = 0; t < o.prompt_len; ++t) r.prompt.push_back(token(rng));
    r.max_new_tokens = o.gen_len;
    r.stop_token_ids = c.eos_token_ids;
    r.ignore_eos = o.ignore_eos;
    requests.push_back(std::move(r));
  }

  BatchEngine engine(model, policy);
  int64_t generated = 0;
  auto t0 = std::chrono::steady_clock::now();
  engine.run(std::move(requests), [&](Completion&& done) { generated += int64_t(done.tokens.size()); });
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats& s = engine.stats();

  const double prompt_tokens = double(o.requests) * o.prompt_len;
  const double prefill_tps = s.prefill_tokens / s.prefill_seconds;
  const double decode_tps = s.decode_tokens / s.decode_seconds;
  const double total_tps = (prompt_tokens + double(generated)) / wall;
  const double bytes = s.weight_bytes + s.kv_bytes;
  const double roofline_seconds = std::max(bytes / dram, s.flops / peak);
  const double expert_gemm_rate = s.expert_flops / s.expert_gemm_seconds;
  const size_t weights_bytes = ms.total_bytes;
  const size_t peak_rss = peak_resident_bytes();
  const double memory_bound = double(weights_bytes + s.kv_cache_bytes) * 1.10;

  if (o.json) {
    nlohmann::json j = {
        {"model", o.preset.empty() ? o.model_dir : o.preset},
        {"layers", c.num_layers},
        {"requests", o.requests},
        {"prompt_len", o.prompt_len},
        {"gen_len", o.gen_len},
        {"prefill_tokens_per_s", prefill_tps},
        {"decode_tokens_per_s", decode_tps},
        {"total_tokens_per_s", total_tps},
        {"generated_tokens", generated},
        {"wall_seconds", wall},
        {"policy", policy.to_json()},
        {"fraction_of_roofline", roofline_seconds / wall},
        {"dram_bytes_per_s", dram},
        {"gemm_peak_flops", peak},
        {"achieved_bytes_per_s", bytes / wall},
        {"achieved_flops", s.flops / wall},
        {"expert_gemm_flops", expert_gemm_rate},
        {"expert_gemm_fraction_of_peak", expert_gemm_rate / peak},
        {"stage_seconds",
         {{"attention", s.attention_seconds},
          {"experts", s.expert_seconds},
          {"dense", s.dense_seconds},
          {"sampling", s.sampling_seconds},
          {"scheduling", s.scheduling_seconds}}},
        {"peak_resident_bytes", peak_rss},
        {"weights_bytes", weights_bytes},
        {"kv_cache_bytes", s.kv_cache_bytes},
    };
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("model      {} ({} layers), {} of weights, made/loaded in {:.1f} s\n",
             o.preset.empty() ? o.model_dir : o.preset, c.num_layers,
             human_bytes(double(weights_bytes)), load_seconds);
  fmt::print("machine    {} threads, DRAM {:.1f} GB/s, bf16 GEMM peak {:.0f} GFLOP/s (measured)\n",
             policy.threads, dram / 1e9, peak / 1e9);
  fmt::print("workload   {} requests, prompt {}, generate {}{}\n", o.requests, o.prompt_len,
             o.gen_len, o.ignore_eos ? " (EOS ignored)" : "");
  fmt::print("policy     {}\n", policy.describe());
  fmt::print("\nprefill    {:9.1f} tokens/s   ({} tokens)\n", prefill_tps, s.prefill_tokens);
  fmt::print("decode     {:9.1f} tokens/s   ({} tokens)\n", decode_tps, s.decode_tokens);
  fmt::print("end to end {:9.1f} tokens/s   ({} prompt + {} generated in {:.2f} s, {} steps)\n",
             total_tps, prompt_tokens, generated, wall, s.steps);
  const double stages = s.attention_seconds + s.expert_seconds + s.dense_seconds +
                        s.sampling_seconds + s.scheduling_seconds;
  fmt::print("\ntime by stage\n");
  for (auto [name, sec] : {std::pair{"experts", s.expert_seconds}, {"dense (norm, QKV, O, router, lm_head)", s.dense_seconds},
                           {"attention (RoPE, KV write, attention)", s.attention_seconds},
                           {"sampling", s.sampling_seconds}, {"scheduling", s.scheduling_seconds}})
    fmt::print("  {:<40} {:8.3f} s  {:5.1f}%\n", name, sec, 100 * sec / stages);
  fmt::print("\nmoved      {:.2f} GB/s ({:.0f}% of DRAM bandwidth): weights {}, KV {}\n", bytes / wall / 1e9,
             100 * bytes / wall / dram, human_bytes(s.weight_bytes), human_bytes(s.kv_bytes));
  fmt::print("computed   {:.0f} GFLOP/s ({:.0f}% of GEMM peak)\n", s.flops / wall / 1e9,
             100 * s.flops / wall / peak);
  fmt::print("experts    {:.0f} GFLOP/s in their GEMMs ({:.0f}% of peak), {:.1f} tokens per expert GEMM\n",
             expert_gemm_rate / 1e9, 100 * expert_gemm_rate / peak,
             double(s.expert_tokens) / std::max<int64_t>(1, s.expert_gemm_calls));
  fmt::print("roofline   the work done bounds the run at {:.2f} s: {:.0f}% of roofline\n",
             roofline_seconds, 100 * roofline_seconds / wall);
  fmt::print("memory     peak resident {} vs weights {} + KV cache {} (+10%: {}){}\n",
             human_bytes(double(peak_rss)), human_bytes(double(weights_bytes)),
             human_bytes(double(s.kv_cache_bytes)), human_bytes(memory_bound),
             double(peak_rss) <= memory_bound ? "" : "  OVER BUDGET");
  fmt::print("KV cache   peak use {:.0f}% of {}\n", 100 * s.peak_kv_usage, human_bytes(double(s.kv_cache_bytes)));
  return 0;
}

RegisterCommand reg({"bench", "Measure batch throughput on synthetic prompts", [](CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("--model", o->model_dir, "Model folder");
  sub.add_option("--preset", o->preset, "Make a model of this shape in memory")
      ->check(CLI::IsMember(preset_names()));
  sub.add_option("--layers", o->layers, "With --preset: keep only the first N layers")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--prompt-len", o->prompt_len, "Prompt tokens per request")->capture_default_str()->check(CLI::PositiveNumber);
  sub.add_option("--gen-len", o->gen_len, "Tokens to generate per request")->capture_default_str()->check(CLI::PositiveNumber);
  sub.add_option("--requests", o->requests, "Number of requests")->capture_default_str()->check(CLI::PositiveNumber);
  sub.add_flag("--ignore-eos", o->ignore_eos, "Generate exactly --gen-len tokens");
  sub.add_flag("--json", o->json, "Print one JSON object");
  sub.add_option("--seed", o->seed, "Seed of weights and prompts")->capture_default_str();
  sub.add_option("--kv-memory", o->kv_memory, "Host memory for the KV cache (default: half of what is free)");
  add_policy_options(sub, o->policy);
  return std::function<int()>([o] { return run(*o); });
}});

}  // namespace
}  // namespace sluice::cli
