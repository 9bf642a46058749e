// sluice logits: evaluates token ids as one sequence and prints one line of logits per position
// (whitespace-separated floats). Outside checks rely on this exact format.
#include <fmt/format.h>

#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "cli/policy_options.h"
#include "model/expert_quant.h"
#include "model/reference_forward.h"

namespace sluice::cli {
namespace {

std::vector<int> parse_token_list(const std::string& text) {
  std::vector<int> ids;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    size_t used = 0;
    long value = -1;
    try {
      value = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || value < 0 || value > INT32_MAX)
      fail("--tokens: item {} is '{}', expected a non-negative integer token id", ids.size() + 1,
           item);
    ids.push_back(int(value));
    i = j + 1;
  }
  return ids;
}

struct Options {
  std::string model;
  std::string tokens;
  ExpertDtype expert_dtype = ExpertDtype::kBf16;
  int expert_group = 0;
};

int run(const Options& o) {
  std::vector<int> ids = parse_token_list(o.tokens);
  Model model = load_model(o.model);
  quantize_model_experts(model, {o.expert_dtype, o.expert_group});
  ReferenceForward forward(model);
  std::vector<float> logits = forward.forward(ids);
  const int vocab = model.config.vocab_size;
  std::string line;
  for (size_t t = 0; t < ids.size(); ++t) {
    line.clear();
    for (int v = 0; v < vocab; ++v) {
      if (v) line += ' ';
      fmt::format_to(std::back_inserter(line), "{}", logits[t * vocab + v]);
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stdout);
  }
  return 0;
}

RegisterCommand reg(
    {"logits", "Print the logits of every position of a token sequence", [](CLI::App& sub) {
       auto o = std::make_shared<Options>();
       sub.add_option("--model", o->model, "Model folder or .gguf file")->required();
       sub.add_option("--tokens", o->tokens, "Token ids, comma-separated")->required();
       // The reference forward multiplies quantized experts dequantized (scale · q) with fp32
       // activations: the weights' quantization error alone.
       add_expert_dtype_options(sub, o->expert_dtype, o->expert_group, "Experts");
       return std::function<int()>([o] { return run(*o); });
     }});

}  // namespace
}  // namespace sluice::cli
