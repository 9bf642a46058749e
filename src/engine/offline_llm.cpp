#include "engine/offline_llm.h"

#include <omp.h>

#include <random>

#include "core/error.h"
#include "engine/batch_engine.h"
#include "engine/engine_plan.h"
#include "engine/stop_strings.h"
#include "engine/weights_in_memory.h"
#include "model/expert_quant.h"

namespace sluice {
namespace {

void validate(const GenerationParams& p) {
  if (p.max_tokens < 1) fail("max_tokens: expected at least 1, got {}", p.max_tokens);
  for (const std::string& s : p.stop)
    if (s.empty()) fail("stop: expected non-empty strings");
}

Request make_request(size_t index, std::vector<int> prompt, const GenerationParams& p,
                     uint64_t seed, const Model& model, const Tokenizer& tokenizer) {
  const int context = model.config.max_position_embeddings;
  const int length = int(prompt.size());
  if (length == 0) fail("prompt {}: the prompt is empty (0 tokens)", index);
  if (length + p.max_tokens > context) {
    fail("prompt {}: {} prompt tokens + max_tokens {} exceed the model's context of {} tokens",
         index, length, p.max_tokens, context);
  }
  for (int id : prompt)
    if (id < 0 || id >= model.config.vocab_size)
      fail("prompt {}: token id {} is outside the vocabulary [0, {})", index, id,
           model.config.vocab_size);
  Request r;
  r.id = int64_t(index);
  r.prompt = std::move(prompt);
  r.max_new_tokens = p.max_tokens;
  r.sampling = {p.temperature, p.top_p, p.top_k, seed + index};
  sluice::validate(r.sampling);
  r.stop_token_ids = model.config.eos_token_ids;
  r.stop_check = make_stop_check(tokenizer, p.stop);
  return r;
}

GenerationResult result_of(const Completion& c, std::vector<int> prompt, const GenerationParams& p,
                           const Model& model, const Tokenizer& tokenizer) {
  if (c.reason == FinishReason::kError) fail("prompt {}: {}", c.id, c.error);
  CompletionText text = completion_text(c, model.config.eos_token_ids, tokenizer, p.stop);
  GenerationResult r;
  r.prompt_token_ids = std::move(prompt);
  r.text = std::move(text.text);
  r.token_ids = c.tokens;
  r.finish_reason = text.finish_reason;
  return r;
}

}  // namespace

OfflineLlm::OfflineLlm(const std::filesystem::path& model, Policy policy, DeviceOptions device,
                       size_t host_memory_bytes)
    : model_dir_(model),
      policy_(policy),
      device_(std::move(device)),
      host_memory_bytes_(host_memory_bytes) {
  // As `sluice run` loads it: the disk tier where the weights exceed the host memory.
  budget_ = host_budget(host_memory_bytes_, true);
  model_ = load_model_for_run(model, {policy_.expert_dtype, policy_.expert_group}, budget_);
  read_weights_if_they_fit(model_);
  tokenizer_ = Tokenizer::load(model);
}

OfflineLlm::~OfflineLlm() = default;

std::vector<GenerationResult> OfflineLlm::generate(const std::vector<std::string>& prompts,
                                                   const GenerationParams& params) {
  std::vector<std::vector<int>> ids;
  for (const std::string& prompt : prompts) {
    std::vector<int32_t> encoded = tokenizer_->encode(prompt);
    ids.emplace_back(encoded.begin(), encoded.end());
  }
  return generate_ids(std::move(ids), params);
}

std::vector<GenerationResult> OfflineLlm::chat(
    const std::vector<nlohmann::ordered_json>& conversations, const GenerationParams& params) {
  if (!prompter_) prompter_.emplace(ChatPrompter::load(model_dir_, *tokenizer_));
  std::vector<std::vector<int>> ids;
  for (const auto& messages : conversations) ids.push_back(prompter_->encode(messages));
  return generate_ids(std::move(ids), params);
}

std::vector<GenerationResult> OfflineLlm::generate_ids(std::vector<std::vector<int>> prompts,
                                                       const GenerationParams& params) {
  validate(params);
  if (prompts.empty()) return {};
  const uint64_t seed = params.seed ? *params.seed : std::random_device()();
  std::vector<Request> requests;
  for (size_t i = 0; i < prompts.size(); ++i)
    requests.push_back(make_request(i, prompts[i], params, seed, model_, *tokenizer_));
  DeviceOptions device = device_;
  const EnginePlan plan = plan_for_requests(model_, policy_, device, requests, budget_.bytes);
  omp_set_num_threads(plan.policy.threads);
  BatchEngine engine(model_, plan.policy, device);
  std::vector<Completion> completions(requests.size());
  engine.run(std::move(requests),
             [&](Completion&& c) { completions[size_t(c.id)] = std::move(c); });
  std::vector<GenerationResult> results;
  for (size_t i = 0; i < completions.size(); ++i)
    results.push_back(
        result_of(completions[i], std::move(prompts[i]), params, model_, *tokenizer_));
  return results;
}

}  // namespace sluice
