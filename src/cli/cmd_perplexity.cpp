// sluice perplexity: the perplexity of a model over a text file (engine/perplexity.h says how it
// is measured), with --compare DIR2 the KL divergence and top-1 agreement of a second model
// against the first; with --expert-dtype int8|int4 alone, of the model's quantized experts
// against its own.
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/command.h"
#include "cli/policy_options.h"
#include "core/error.h"
#include "engine/batch_engine.h"
#include "engine/engine_plan.h"
#include "engine/perplexity.h"
#include "engine/weights_in_memory.h"
#include "io/tokenizer.h"
#include "model/expert_quant.h"

namespace sluice::cli {
namespace {

struct Options {
  std::string model_dir, file, compare_dir;
  int ctx = 0;
  bool json = false;
  Policy policy;
  std::string host_mem;
  DeviceOptions device;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open the text file", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) fail("{}: the text file is empty", path);
  return text.str();
}

// --ctx, or 512 tokens (llama.cpp's default) where the model's context allows.
int window_length(const Options& o, const ModelConfig& c) {
  const int ctx = o.ctx > 0 ? o.ctx : std::min(512, c.max_position_embeddings);
  if (ctx > c.max_position_embeddings)
    fail(
        "perplexity: --ctx {} is longer than the model's context ({}, config field "
        "'max_position_embeddings')",
        ctx, c.max_position_embeddings);
  return ctx;
}

// The engine for `model`, planned for the windows as requests, with room for the logits of every
// row a step holds.
std::unique_ptr<BatchEngine> make_engine(const Model& model, const Options& o,
                                         const HostBudget& budget, const PerplexityWindows& w,
                                         DeviceOptions& device) {
  std::vector<Request> requests;
  for (size_t i = 0; i < w.inputs.size(); ++i) {
    Request r;
    r.prompt = w.inputs[i];
    r.max_new_tokens = 1;
    requests.push_back(std::move(r));
  }
  EnginePlan plan = plan_for_requests(model, o.policy, device, requests, budget.bytes);
  Policy policy = plan.policy;
  policy.logit_rows = policy.batch + policy.prefill_chunk;
  omp_set_num_threads(policy.threads);
  return std::make_unique<BatchEngine>(model, policy, device);
}

// A line on stderr as windows finish: rewritten in place on a terminal, every 10% otherwise.
PerplexityProgress progress_line() {
  const bool tty = isatty(STDERR_FILENO) != 0;
  return [tty, last_tenth = int64_t(-1)](int64_t done, int64_t total,
                                         const PerplexityResult& r) mutable {
    const int64_t tenth = done * 10 / total;
    if (!tty && tenth == last_tenth && done != total) return;
    last_tenth = tenth;
    fmt::print(stderr, "{}[{}/{} windows] perplexity so far {:.4f}{}", tty ? "\r" : "", done, total,
               r.perplexity(), tty && done != total ? "" : "\n");
  };
}

nlohmann::json perplexity_json(const PerplexityResult& r) {
  return {{"perplexity", r.perplexity()},
          {"perplexity_std_error", r.std_error()},
          {"mean_nll", r.nll.mean()},
          {"tokens_scored", r.nll.count}};
}

// The second model of a comparison: --compare DIR2, or with a quantized --expert-dtype alone the
// same folder with its experts quantized (then the first is the folder as it is, in bf16).
struct Compared {
  std::string dir, label;
};
std::optional<Compared> compared(const Options& o) {
  if (!o.compare_dir.empty()) return Compared{o.compare_dir, o.compare_dir};
  if (o.policy.expert_dtype == ExpertDtype::kBf16) return std::nullopt;
  return Compared{o.model_dir, fmt::format("{} with {} experts", o.model_dir,
                                           expert_dtype_name(o.policy.expert_dtype))};
}

// `dir` loaded within `budget`, its experts quantized as --expert-dtype asks when `quantize`.
Model load_with_experts(const std::string& dir, const Options& o, const HostBudget& budget,
                        bool quantize) {
  const ExpertQuant quant =
      quantize ? ExpertQuant{o.policy.expert_dtype, o.policy.expert_group} : ExpertQuant{};
  return load_model_for_run(dir, quant, budget);
}

// With a second model to compare, each gets half of the budget: both are held at once.
HostBudget model_budget(const Options& o, bool comparing) {
  HostBudget b = host_memory_budget(o.host_mem, true);  // before loading takes some
  if (!comparing) return b;
  return {b.bytes / 2, "half of " + b.source + ", for each of the two models compared"};
}

int run(const Options& o) {
  const std::optional<Compared> other_model = compared(o);
  // Compared against its own quantization (no --compare), the first model keeps its experts.
  const HostBudget budget = model_budget(o, other_model.has_value());
  Model model = load_with_experts(o.model_dir, o, budget, !o.compare_dir.empty());
  auto tok = Tokenizer::load(o.model_dir);
  const std::vector<int32_t> tokens = tok->encode(read_text(o.file), false);
  const int ctx = window_length(o, model.config);
  const PerplexityWindows windows = make_windows(tokens, ctx, tok->bos_id());
  DeviceOptions device = o.device;
  auto engine = make_engine(model, o, budget, windows, device);

  nlohmann::json out = {{"model", o.model_dir},
                        {"file", o.file},
                        {"text_tokens", tokens.size()},
                        {"ctx", ctx},
                        {"windows", windows.inputs.size()}};
  if (!other_model) {
    const PerplexityResult r = score_perplexity(*engine, windows, progress_line());
    out.update(perplexity_json(r));
  } else {
    Model other = load_with_experts(other_model->dir, o, budget, true);
    DeviceOptions other_device = o.device;
    auto other_engine = make_engine(other, o, budget, windows, other_device);
    // Both engines' log-probabilities of the windows in flight: at most ~256 MiB of them.
    const size_t per_window =
        size_t(ctx - 1 - windows.first) * size_t(model.config.vocab_size) * sizeof(float);
    const int at_once = o.policy.batch > 0
                            ? o.policy.batch
                            : int(std::max<size_t>(1, (size_t(256) << 20) / per_window));
    const ComparisonResult r =
        compare_models(*engine, *other_engine, windows, at_once, progress_line());
    out.update(perplexity_json(r.base));
    out["compare"] = perplexity_json(r.other);
    out["compare"].update({{"model", other_model->label},
                           {"mean_kl_divergence", r.kl.mean()},
                           {"kl_divergence_std_error", r.kl.std_error()},
                           {"top1_agreement", r.top1_agreement()}});
  }
  if (o.json) {
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("model       {}\n", o.model_dir);
  fmt::print(
      "text        {}: {} tokens, {} windows of {} (the second half of each scored: {} "
      "tokens)\n",
      o.file, tokens.size(), windows.inputs.size(), ctx, out["tokens_scored"].get<int64_t>());
  fmt::print("perplexity  {:.4f} ± {:.4f}\n", out["perplexity"].get<double>(),
             out["perplexity_std_error"].get<double>());
  if (out.contains("compare")) {
    const auto& c = out["compare"];
    fmt::print("compare     {}: perplexity {:.4f} ± {:.4f}\n", c["model"].get<std::string>(),
               c["perplexity"].get<double>(), c["perplexity_std_error"].get<double>());
    fmt::print("            mean KL divergence {:.6f} ± {:.6f} nats, top-1 agreement {:.2f}%\n",
               c["mean_kl_divergence"].get<double>(), c["kl_divergence_std_error"].get<double>(),
               100.0 * c["top1_agreement"].get<double>());
  }
  return 0;
}

RegisterCommand reg(
    {"perplexity", "Perplexity of a model over a text file (and KL against a second model)",
     [](CLI::App& sub) {
       auto o = std::make_shared<Options>();
       sub.add_option("--model", o->model_dir, "Model folder")->required();
       sub.add_option("--file", o->file, "Text file to score")->required();
       sub.add_option("--ctx", o->ctx,
                      "Tokens per window (default: 512, or the model's context if shorter)")
           ->check(CLI::PositiveNumber);
       sub.add_option("--compare", o->compare_dir,
                      "Second model folder: its KL divergence and top-1 agreement against "
                      "--model, over the same positions");
       sub.add_flag("--json", o->json, "Print the results as JSON");
       add_policy_options(sub, o->policy);
       add_host_memory_option(sub, o->host_mem);
       add_device_options(sub, o->device);
       return std::function<int()>([o] { return run(*o); });
     }});

}  // namespace
}  // namespace sluice::cli
