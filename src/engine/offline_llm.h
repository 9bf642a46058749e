// An engine for in-process use (the Python module's LLM): the model, its tokenizer and chat
// template loaded once, then batches of prompts or conversations run through the batch engine
// with the planner's policy, each call returning one result per input, in order.
//
// A prompt is encoded and its result decoded the way `sluice run` does it: the tokenizer's BOS
// added to plain prompts, chat turns rendered by the template (which writes its own special
// tokens), the stop token left out of the text, special tokens skipped, the text cut before the
// earliest stop string. So greedy results equal `sluice run`'s for the same prompts and policy.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_device.h"
#include "engine/host_budget.h"
#include "io/chat_prompt.h"
#include "io/tokenizer.h"
#include "model/weights.h"
#include "runtime/policy.h"
#include "runtime/sampling.h"

namespace sluice {

struct GenerationParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;                 // 0: no limit
  std::optional<uint64_t> seed;  // request i samples with seed + i; none: a random seed
  int max_tokens = 16;
  std::vector<std::string> stop;  // stop strings
};

struct GenerationResult {
  std::vector<int> prompt_token_ids;
  std::string text;
  std::vector<int> token_ids;  // every generated token, the stop token included
  std::string finish_reason;   // "stop" or "length"
};

class OfflineLlm {
 public:
  // host_memory_bytes 0: default_host_memory (engine/engine_plan.h).
  OfflineLlm(const std::filesystem::path& model, Policy policy, DeviceOptions device,
             size_t host_memory_bytes);
  ~OfflineLlm();

  std::vector<GenerationResult> generate(const std::vector<std::string>& prompts,
                                         const GenerationParams& params);
  // Each conversation: a JSON array of messages, rendered with the generation prompt.
  std::vector<GenerationResult> chat(const std::vector<nlohmann::ordered_json>& conversations,
                                     const GenerationParams& params);
  std::vector<GenerationResult> generate_ids(std::vector<std::vector<int>> prompts,
                                             const GenerationParams& params);

  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  std::filesystem::path model_dir_;
  Policy policy_;
  DeviceOptions device_;
  size_t host_memory_bytes_;  // --host-mem's bytes; 0: the default budget
  HostBudget budget_;
  Model model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatPrompter> prompter_;
};

}  // namespace sluice
