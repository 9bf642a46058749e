// sluice generate: continues one prompt (--prompt) or every line of a file (--input, run as one
// batch through the engine) with the model's own tokenizer. With --chat each prompt is sent as one
// user message through the model's chat template, and only the reply is printed.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <fstream>
#include <memory>
#include <optional>

#include "cli/command.h"
#include "cli/policy_options.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/batch_engine.h"
#include "engine/engine_plan.h"
#include "engine/weights_in_memory.h"
#include "io/chat_prompt.h"
#include "io/tokenizer.h"
#include "model/expert_quant.h"
#include "model/reference_forward.h"

namespace sluice::cli {
namespace {

struct Options {
  std::string model_dir, prompt, input;
  int max_new_tokens = 64;
  SamplingParams sampling;
  bool reference = false;
  bool chat = false;
  bool token_ids = false;
  Policy policy;
  std::string host_mem;
  DeviceOptions device;
};

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open prompts file", path);
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
  }
  if (prompts.empty()) fail("{}: no prompts (expected one prompt per line)", path);
  return prompts;
}

// The prompt's token ids: plain text with the tokenizer's BOS, or a chat turn rendered by the
// template (which writes its own BOS).
std::vector<int> encode_prompt(const std::string& text, const Tokenizer& tok,
                               const ChatPrompter* chat) {
  if (chat) return chat->encode(single_user_message(text));
  std::vector<int32_t> ids = tok.encode(text);
  return std::vector<int>(ids.begin(), ids.end());
}

// The plain path: the reference forward, one token at a time, streaming text as it comes.
int generate_with_reference(const Model& model, const Tokenizer& tok, const Options& o,
                            const ChatPrompter* chat) {
  std::vector<int> ids = encode_prompt(o.prompt, tok, chat);
  ReferenceForward forward(model);
  Sampler sampler(o.sampling);
  StreamingDecoder out(tok);
  const auto& eos = model.config.eos_token_ids;
  auto t0 = Clock::now();
  std::vector<float> logits = forward.forward(ids);
  int generated = 0;
  if (!chat) fmt::print("{}", o.prompt);
  while (generated < o.max_new_tokens) {
    const int vocab = model.config.vocab_size;
    int next = sampler.sample(std::span(logits).last(size_t(vocab)));
    ++generated;
    if (std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    fmt::print("{}", out.push(next));
    std::fflush(stdout);
    if (generated == o.max_new_tokens) break;
    int one[] = {next};
    logits = forward.forward(one);
  }
  fmt::print("{}\n", out.flush());
  double seconds = seconds_since(t0);
  fmt::print(stderr,
             "{} prompt + {} generated tokens in {:.2f} s ({:.1f} tokens/s, reference path)\n",
             ids.size(), generated, seconds, generated / seconds);
  return 0;
}

int run(const Options& o) {
  if (o.prompt.empty() == o.input.empty())
    fail("generate: give exactly one of --prompt or --input");
  validate(o.sampling);
  // The reference forward reads every weight where it is: the experts stay mapped, whatever the
  // budget.
  const HostBudget budget =
      o.reference ? HostBudget{SIZE_MAX, "--reference"} : host_memory_budget(o.host_mem, true);
  Model model =
      load_model_for_run(o.model_dir, {o.policy.expert_dtype, o.policy.expert_group}, budget);
  auto tok = Tokenizer::load(o.model_dir);
  std::optional<ChatPrompter> chat;
  if (o.chat) chat.emplace(ChatPrompter::load(o.model_dir, *tok));
  const ChatPrompter* chat_ptr = chat ? &*chat : nullptr;
  if (o.reference) {
    if (o.prompt.empty()) fail("generate: --reference runs one --prompt");
    if (o.token_ids) fail("generate: --token-ids is for the batch engine, not --reference");
    return generate_with_reference(model, *tok, o, chat_ptr);
  }
  std::vector<std::string> prompts =
      o.input.empty() ? std::vector{o.prompt} : read_prompts(o.input);
  std::vector<Request> requests;
  int max_prompt = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.id = int64_t(i);
    r.prompt = encode_prompt(prompts[i], *tok, chat_ptr);
    r.max_new_tokens = o.max_new_tokens;
    r.sampling = o.sampling;
    r.sampling.seed = o.sampling.seed + i;
    r.stop_token_ids = model.config.eos_token_ids;
    max_prompt = std::max(max_prompt, int(r.prompt.size()));
    requests.push_back(std::move(r));
  }
  DeviceOptions device = o.device;
  const EnginePlan plan = plan_for_requests(model, o.policy, device, requests, budget.bytes);
  const Policy& policy = plan.policy;
  omp_set_num_threads(policy.threads);
  BatchEngine engine(model, policy, device);
  std::vector<Completion> results(requests.size());
  auto t0 = Clock::now();
  engine.run(std::move(requests), [&](Completion&& c) { results[size_t(c.id)] = std::move(c); });
  double seconds = seconds_since(t0);
  int64_t generated = 0;
  int failed = 0;
  const auto& eos = model.config.eos_token_ids;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].reason == FinishReason::kError) {  // it could never run; the others did
      ++failed;
      fmt::print(stderr, "error: prompt {} ({} tokens): {} ({})\n", i + 1, results[i].prompt_tokens,
                 results[i].error, request_failure_code(results[i].failure));
      continue;
    }
    std::vector<int> tokens = results[i].tokens;
    if (results[i].reason == FinishReason::kStop && !tokens.empty() &&
        std::find(eos.begin(), eos.end(), tokens.back()) != eos.end())
      tokens.pop_back();
    generated += int64_t(results[i].tokens.size());
    if (results.size() > 1) fmt::print("[{}] ", i + 1);
    fmt::print("{}{}\n", chat ? "" : prompts[i], tok->decode(tokens));
    if (o.token_ids) fmt::print("  token ids: {}\n", fmt::join(results[i].tokens, ","));
  }
  fmt::print(stderr, "{} prompts, {} tokens generated in {:.2f} s ({:.1f} tokens/s); policy {}\n",
             results.size(), generated, seconds, generated / seconds, plan.describe());
  if (failed > 0) {
    fmt::print(stderr, "error: {} of {} prompts failed (see above)\n", failed, results.size());
    return 1;
  }
  return 0;
}

RegisterCommand reg(
    {"generate", "Continue a prompt, or each line of a file as one batch", [](CLI::App& sub) {
       auto o = std::make_shared<Options>();
       sub.add_option("--model", o->model_dir, "Model folder or .gguf file")->required();
       sub.add_option("--prompt", o->prompt, "Prompt text");
       sub.add_option("--input", o->input, "File with one prompt per line");
       sub.add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       sub.add_option("--temperature", o->sampling.temperature, "0: greedy")->capture_default_str();
       sub.add_option("--top-p", o->sampling.top_p, "Nucleus mass")->capture_default_str();
       sub.add_option("--top-k", o->sampling.top_k, "Keep the k most likely (0: all)")
           ->capture_default_str();
       sub.add_option("--seed", o->sampling.seed, "Sampling seed")->capture_default_str();
       sub.add_flag("--chat", o->chat,
                    "Send each prompt as one user message through the model's "
                    "chat template; print only the reply");
       sub.add_flag("--token-ids", o->token_ids,
                    "After each continuation, print the generated token ids (the end-of-text "
                    "token included): what to compare between two runs");
       sub.add_flag("--reference", o->reference,
                    "Use the plain reference forward (one prompt, streamed)");
       add_policy_options(sub, o->policy);
       add_host_memory_option(sub, o->host_mem);
       add_device_options(sub, o->device);
       return std::function<int()>([o] { return run(*o); });
     }});

}  // namespace
}  // namespace sluice::cli
