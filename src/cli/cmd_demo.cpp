// sluice demo: the built-in default job. Makes a small synthetic Mixtral, runs a batch of
// prompts through the engine, and says what it did and how fast.
#include <fmt/format.h>
#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <memory>

#include "cli/command.h"
#include "core/units.h"
#include "engine/batch_engine.h"
#include "engine/throughput_report.h"
#include "io/tokenizer.h"
#include "model/model_stats.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/memory_info.h"

namespace sluice::cli {
namespace {

std::filesystem::path default_dir() {
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::filesystem::path base = cache && *cache ? cache
                               : home && *home ? std::filesystem::path(home) / ".cache"
                                               : std::filesystem::temp_directory_path();
  return base / "sluice" / "demo-tiny-mixtral";
}

int run(std::string dir_option, int max_new_tokens) {
  using Clock = std::chrono::steady_clock;
  const std::filesystem::path dir = dir_option.empty() ? default_dir() : std::filesystem::path(dir_option);
  ModelConfig config = preset_config("tiny-mixtral");
  auto t0 = Clock::now();
  write_random_checkpoint(config, dir, /*seed=*/0);
  Model model = load_model(dir);
  auto tok = Tokenizer::load(dir);
  ModelStats ms = model_stats(model);
  fmt::print("1. made a synthetic Mixtral with random weights in {} ({:.2f} s)\n", dir.string(),
             std::chrono::duration<double>(Clock::now() - t0).count());
  fmt::print("   {} layers, hidden {}, {} experts (top {}), {} heads / {} KV heads: {} parameters, {} active per token\n",
             config.num_layers, config.hidden_size, config.num_experts, config.experts_per_token,
             config.num_heads, config.num_kv_heads, human_count(double(ms.total_params)),
             human_count(double(ms.active_params_per_token)));

  const std::vector<std::string> prompts = {
      "The quick brown fox", "Hello world!", "A mixture of experts routes each token",
      "Throughput is what matters", "Here is a question:", "The best schedule keeps both",
      "When the weights do not fit", "It is forty two,"};
  std::vector<Request> requests;
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.id = int64_t(i);
    r.prompt = tok->encode(prompts[i]);
    r.max_new_tokens = max_new_tokens;
    r.stop_token_ids = config.eos_token_ids;
    prompt_tokens += int64_t(r.prompt.size());
    requests.push_back(std::move(r));
  }
  Policy policy = resolve_policy(Policy{}, config, {int(prompts.size()), 16, max_new_tokens},
                                 size_t(64) << 20);
  omp_set_num_threads(policy.threads);
  BatchEngine engine(model, policy);
  std::vector<Completion> done(prompts.size());
  t0 = Clock::now();
  engine.run(std::move(requests), [&](Completion&& c) { done[size_t(c.id)] = std::move(c); });
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  fmt::print("2. generated greedily for {} prompts as one batch (policy {}):\n", prompts.size(),
             policy.describe());
  int64_t generated = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    generated += int64_t(done[i].tokens.size());
    fmt::print("   {:<40} -> {:?}\n", fmt::format("{:?}", prompts[i]), tok->decode(done[i].tokens, true));
  }
  fmt::print("   (the weights are random, so the text is too)\n");
  const Ceilings ceilings = measure_ceilings();
  const ThroughputReport r = summarize(engine.stats(), seconds, prompt_tokens, generated, ceilings);
  fmt::print("3. {} prompt + {} generated tokens in {:.3f} s: {:.0f} tokens/s end to end\n",
             prompt_tokens, generated, seconds, r.total_tokens_per_s);
  fmt::print("   moved {:.2f} GB/s = {:.1f}% of this machine's DRAM bandwidth ({:.1f} GB/s, measured);\n"
             "   computed {:.2f} GFLOP/s = {:.1f}% of its bf16 GEMM peak ({:.0f} GFLOP/s, measured):\n"
             "   a model this small is bound by per-step overheads, not by the hardware\n",
             r.bytes_per_s / 1e9, 100 * r.fraction_of_dram, ceilings.dram_bytes_per_s / 1e9,
             r.flops_per_s / 1e9, 100 * r.fraction_of_gemm_peak, ceilings.gemm_flops / 1e9);
  fmt::print("\nnext: sluice bench --preset mixtral-8x7b --layers 4 --prompt-len 128 --gen-len 32 "
             "--requests 64 --ignore-eos\n");
  return 0;
}

RegisterCommand reg({"demo", "Make a small synthetic Mixtral and generate with it (the quick start)",
                     [](CLI::App& sub) {
                       auto dir = std::make_shared<std::string>();
                       auto tokens = std::make_shared<int>(24);
                       sub.add_option("--dir", *dir, "Where to write the model (default: the cache folder)");
                       sub.add_option("--max-new-tokens", *tokens, "Tokens per prompt")->capture_default_str();
                       return std::function<int()>([dir, tokens] { return run(*dir, *tokens); });
                     }});

}  // namespace
}  // namespace sluice::cli
