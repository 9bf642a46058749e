// sluice demo: the built-in default job. Runs a JSONL batch of requests (plain completions, chat
// messages, the OpenAI Batch shape) through the same job as `sluice run` on the small MoE that
// ships with sluice (models/moby-moe, trained by scripts/train-demo-model.py), and says what it
// did and how fast.
#include <fmt/format.h>

#include <cstdlib>
#include <memory>
#include <sstream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/batch_job.h"
#include "engine/throughput_report.h"
#include "io/staged_output.h"
#include "model/model_stats.h"

namespace sluice::cli {
namespace {

std::filesystem::path default_dir() {
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::filesystem::path base = cache && *cache ? cache
                               : home && *home ? std::filesystem::path(home) / ".cache"
                                               : std::filesystem::temp_directory_path();
  return base / "sluice" / "demo";
}

// Eight requests in the three shapes `sluice run` reads.
void write_demo_requests(const std::filesystem::path& path) {
  using nlohmann::json;
  const char* prompts[] = {"Call me Ishmael. Some years ago", "The whale",
                           "Captain Ahab stood upon the quarter-deck, and",
                           "It was a dark night, and the ship", "Queequeg and I"};
  std::ostringstream out;
  int n = 0;
  for (const char* p : prompts)
    out << json{{"custom_id", fmt::format("prompt-{}", ++n)},
                {"prompt", p},
                {"max_tokens", 32},
                {"temperature", 0}}
               .dump()
        << "\n";
  out << json{{"custom_id", "chat-1"},
              {"messages",
               {{{"role", "system"}, {"content", "You are a sailor."}},
                {{"role", "user"}, {"content", "Tell me about the sea."}}}},
              {"max_tokens", 32},
              {"temperature", 0}}
             .dump()
      << "\n";
  for (const char* url : {"/v1/completions", "/v1/chat/completions"}) {
    json body = {{"model", "moby-moe"}, {"max_tokens", 32}, {"temperature", 0.7}, {"seed", 7}};
    if (std::string(url) == "/v1/completions")
      body["prompt"] = "The harpooneers";
    else
      body["messages"] = {{{"role", "user"}, {"content", "Where is the white whale?"}}};
    out << json{{"custom_id", fmt::format("openai-{}", ++n)},
                {"method", "POST"},
                {"url", url},
                {"body", body}}
               .dump()
        << "\n";
  }
  write_file_atomically(path, out.str());
}

// The generated text of one result line of the OpenAI Batch shape.
std::string result_text(const nlohmann::json& line) {
  if (line["response"].is_null()) return "error: " + line["error"]["message"].get<std::string>();
  const auto& choice = line["response"]["body"]["choices"][0];
  return choice.contains("message") ? choice["message"]["content"].get<std::string>()
                                    : choice["text"].get<std::string>();
}

// The model --model names, or the one that ships with sluice.
std::filesystem::path demo_model(const std::string& model_option) {
  const std::filesystem::path dir = model_option.empty() ? SLUICE_DEMO_MODEL_DIR : model_option;
  if (!std::filesystem::exists(dir / "config.json"))
    fail("demo: {}: no model folder there (config.json missing); pass --model DIR", dir.string());
  return dir;
}

int run(const std::string& dir_option, const std::string& model_option) {
  const std::filesystem::path dir =
      dir_option.empty() ? default_dir() : std::filesystem::path(dir_option);
  std::filesystem::create_directories(dir);
  const std::filesystem::path model_dir = demo_model(model_option);
  const Model model = load_model(model_dir);
  const ModelConfig& config = model.config;
  ModelStats ms = model_stats(model);
  fmt::print("1. the model: {}\n", model_dir.string());
  fmt::print(
      "   a {} ({} layers, hidden {}, {} experts, top {}): {} parameters, {} active per token{}\n",
      config.architecture, config.num_layers, config.hidden_size, config.num_experts,
      config.experts_per_token, human_count(double(ms.total_params)),
      human_count(double(ms.active_params_per_token)),
      model_option.empty() ? ";\n   small, and trained for minutes on Moby-Dick: expect its words "
                             "and style, not sense"
                           : "");

  BatchJobOptions job;
  job.model_dir = model_dir;
  job.input = dir / "requests.jsonl";
  job.output = dir / "results.jsonl";
  write_demo_requests(job.input);
  std::filesystem::remove(job.output);  // a fresh run each time, not a resumed one
  fmt::print("2. wrote {} requests (completions, chat, OpenAI Batch shape) to {}\n", 8,
             job.input.string());
  fmt::print("   running: sluice run --model {} --input {} --output {}\n", model_dir.string(),
             job.input.string(), job.output.string());
  std::fflush(stdout);
  BatchJobSummary summary = run_batch_job(job);

  fmt::print("3. results in {}:\n", job.output.string());
  std::ifstream results(job.output);
  for (std::string line; std::getline(results, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    fmt::print("   {:<10} {:?}\n", j["custom_id"].get<std::string>(), result_text(j));
  }
  const Ceilings ceilings = measure_ceilings();
  const ThroughputReport r = summarize(summary.engine, summary.engine_seconds,
                                       summary.prompt_tokens, summary.completion_tokens, ceilings);
  fmt::print("4. {}\n", summary.describe());
  fmt::print(
      "   {:.0f} tokens/s end to end; moved {:.2f} GB/s = {:.1f}% of this machine's DRAM "
      "bandwidth ({:.1f} GB/s) and computed {:.2f} GFLOP/s = {:.1f}% of its bf16 GEMM "
      "peak ({:.0f} GFLOP/s), both measured just now: a model this small is bound by "
      "per-step overheads, not by the hardware\n",
      r.total_tokens_per_s, r.bytes_per_s / 1e9, 100 * r.fraction_of_dram,
      ceilings.dram_bytes_per_s / 1e9, r.flops_per_s / 1e9, 100 * r.fraction_of_gemm_peak,
      ceilings.gemm_flops / 1e9);
  fmt::print(
      "\nnext: sluice bench --preset mixtral-8x7b --layers 4 --prompt-len 128 --gen-len 32 "
      "--requests 64 --ignore-eos\n");
  return summary.exit_code();
}

RegisterCommand reg({"demo", "The quick start: a batch job on the small MoE that ships with sluice",
                     [](CLI::App& sub) {
                       auto dir = std::make_shared<std::string>();
                       auto model = std::make_shared<std::string>();
                       sub.add_option("--dir", *dir,
                                      "Where to write the requests and results "
                                      "(default: ~/.cache/sluice/demo)");
                       sub.add_option("--model", *model,
                                      "Model folder (default: models/moby-moe in the source tree)");
                       return std::function<int()>([dir, model] { return run(*dir, *model); });
                     }});

}  // namespace
}  // namespace sluice::cli
