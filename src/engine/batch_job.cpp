#include "engine/batch_job.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <optional>
#include <set>
#include <unordered_map>
#include <variant>

#include "core/clock.h"
#include "core/error.h"
#include "engine/batch_engine.h"
#include "engine/engine_plan.h"
#include "engine/host_budget.h"
#include "engine/job_progress.h"
#include "engine/stop_strings.h"
#include "engine/weights_in_memory.h"
#include "io/batch_format.h"
#include "io/chat_prompt.h"
#include "io/results_file.h"
#include "io/tokenizer.h"
#include "model/expert_quant.h"
#include "model/weights.h"
#include "runtime/memory_info.h"

namespace sluice {
namespace {

struct InputLine {
  int number = 0;
  std::string text;
};

std::vector<InputLine> read_input(const std::filesystem::path& path) {
  if (std::filesystem::is_directory(path))
    fail("{}: the input is a folder; expected a JSONL file", path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open the input file", path.string());
  std::vector<InputLine> lines;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines are allowed
    lines.push_back({number, std::move(text)});
  }
  if (in.bad()) fail("{}: read error", path.string());
  if (lines.empty())
    fail(
        "{}: no requests (expected one JSON request per line, e.g. "
        "{{\"custom_id\": \"a\", \"prompt\": \"Hello\"}})",
        path.string());
  return lines;
}

std::string model_name(const std::filesystem::path& dir) {
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// Seconds since the epoch for `created`; SOURCE_DATE_EPOCH pins it for reproducible files.
int64_t created_now() {
  if (const char* pinned = std::getenv("SOURCE_DATE_EPOCH")) {
    char* end = nullptr;
    long long v = std::strtoll(pinned, &end, 10);
    if (end != pinned && *end == '\0') return v;
  }
  return int64_t(std::time(nullptr));
}

// What a request needs besides the engine's Request to write its result.
struct Pending {
  std::string custom_id;
  BatchEndpoint endpoint = BatchEndpoint::kCompletions;
  std::vector<std::string> stop;
};

struct RequestError {
  const char* code;
  std::string message;
};

class Job {
 public:
  explicit Job(const BatchJobOptions& o) : o_(o) {}

  BatchJobSummary run() {
    const auto t0 = Clock::now();
    const std::vector<InputLine> lines = read_input(o_.input);
    // The budget is measured before loading, which takes some of what the machine has.
    budget_ = host_budget(o_.host_memory_bytes, true);
    model_ =
        load_model_for_run(o_.model_dir, {o_.policy.expert_dtype, o_.policy.expert_group}, budget_);
    read_weights_if_they_fit(model_);
    tokenizer_ = Tokenizer::load(o_.model_dir);
    ResultsFile results(o_.output);
    if (results.torn_bytes_removed() > 0)
      warn("{}: removed a torn last line ({} bytes) left by an interrupted run", o_.output.string(),
           results.torn_bytes_removed());

    std::vector<Request> requests;
    std::unordered_map<std::string, int> first_line;  // custom_id -> line number
    for (const InputLine& input : lines) {
      BatchLine line = parse_batch_line(input.text, input.number);
      auto [seen, inserted] = first_line.emplace(line.custom_id, input.number);
      if (!inserted) {
        warn("{}:{}: custom_id \"{}\" already appeared on line {}; this line is skipped",
             o_.input.string(), input.number, line.custom_id, seen->second);
        ++summary_.duplicates;
        continue;
      }
      ++summary_.requests;
      if (auto done = results.recorded().find(line.custom_id); done != results.recorded().end()) {
        ++summary_.already_done;
        summary_.already_failed += done->second ? 1 : 0;
        continue;
      }
      warn_unknown_fields(line);
      if (!line.request) {
        write_error(results, line.custom_id, line.error_code, line.error_message);
        continue;
      }
      auto prepared = prepare(*line.request, line.custom_id, line.line_number);
      if (auto* error = std::get_if<RequestError>(&prepared)) {
        write_error(results, line.custom_id, error->code, error->message);
        continue;
      }
      Request r = std::get<Request>(std::move(prepared));
      r.id = int64_t(pending_.size());
      pending_.push_back({line.custom_id, line.request->endpoint, line.request->stop});
      requests.push_back(std::move(r));
    }
    fmt::print(stderr, "run: {} requests: {} to run, {} already done, {} failed before running\n",
               summary_.requests, requests.size(), summary_.already_done, summary_.failed);
    if (!requests.empty()) run_engine(std::move(requests), results);
    summary_.wall_seconds = seconds_since(t0);
    return summary_;
  }

 private:
  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) {
    fmt::print(stderr, "warning: {}\n", fmt::format(format, std::forward<Args>(args)...));
  }

  void warn_unknown_fields(const BatchLine& line) {
    for (const std::string& field : line.unknown_fields)
      if (warned_fields_.insert(field).second)
        warn("{}:{}: field '{}' is not used and is ignored (not reported again)", o_.input.string(),
             line.line_number, field);
  }

  void write_error(ResultsFile& results, const std::string& custom_id, const std::string& code,
                   const std::string& message) {
    results.append(format_batch_error(custom_id, code, message));
    ++summary_.failed;
  }

  const ChatPrompter& prompter() {
    if (!prompter_ && prompter_error_.empty()) {
      try {
        prompter_.emplace(ChatPrompter::load(o_.model_dir, *tokenizer_));
      } catch (const Error& e) {
        prompter_error_ = e.what();
      }
    }
    if (!prompter_) fail("{}", prompter_error_);
    return *prompter_;
  }

  // The prompt ids and sampling settings of one request, or why it cannot run.
  std::variant<Request, RequestError> prepare(const BatchRequest& b, const std::string& custom_id,
                                              int line_number) {
    Request r;
    const std::string where = fmt::format("line {}", line_number);
    if (b.endpoint == BatchEndpoint::kChatCompletions) {
      try {
        r.prompt = prompter().encode(b.messages);
      } catch (const std::exception& e) {
        return RequestError{batch_error::kTemplateError, fmt::format("{}: {}", where, e.what())};
      }
    } else if (b.prompt_ids) {
      r.prompt = *b.prompt_ids;
      for (int id : r.prompt)
        if (id >= model_.config.vocab_size)
          return RequestError{batch_error::kInvalidRequest,
                              fmt::format("{}: field 'prompt': token id {} is outside the "
                                          "vocabulary [0, {})",
                                          where, id, model_.config.vocab_size)};
    } else {
      std::vector<int32_t> ids = tokenizer_->encode(b.prompt);
      r.prompt.assign(ids.begin(), ids.end());
    }
    const int context = model_.config.max_position_embeddings;
    const int prompt = int(r.prompt.size());
    if (prompt == 0)
      return RequestError{batch_error::kInvalidRequest,
                          fmt::format("{}: the prompt is empty (0 tokens)", where)};
    if (prompt >= context)
      return RequestError{batch_error::kContextLengthExceeded,
                          fmt::format("{}: the prompt has {} tokens; the model's context holds {}, "
                                      "so none are left to generate",
                                      where, prompt, context)};
    if (b.max_tokens && prompt + *b.max_tokens > context)
      return RequestError{batch_error::kContextLengthExceeded,
                          fmt::format("{}: {} prompt tokens + max_tokens {} exceed the model's "
                                      "context of {} tokens",
                                      where, prompt, *b.max_tokens, context)};
    r.max_new_tokens = b.max_tokens.value_or(std::min(o_.max_tokens_default, context - prompt));
    r.sampling.temperature = b.temperature.value_or(1.0f);
    r.sampling.top_p = b.top_p.value_or(1.0f);
    r.sampling.top_k = b.top_k.value_or(0);
    r.sampling.seed = b.seed.value_or(custom_id_hash(custom_id));
    r.stop_token_ids = model_.config.eos_token_ids;
    r.stop_check = make_stop_check(*tokenizer_, b.stop);
    return r;
  }

  void run_engine(std::vector<Request> requests, ResultsFile& results) {
    if (requests.empty()) return;
    DeviceOptions device = o_.device;
    const EnginePlan plan = plan_for_requests(model_, o_.policy, device, requests, budget_.bytes);
    const Policy& policy = plan.policy;
    omp_set_num_threads(policy.threads);
    fmt::print(stderr, "run: policy {}\n", plan.describe());
    BatchEngine engine(model_, policy, device);
    JobProgress progress(stderr, o_.live_progress, o_.log_seconds);
    progress.start(int64_t(requests.size()));
    engine.set_step_observer(
        [&](const EngineStats& stats, const BatchEngine::Progress& p) { progress.step(stats, p); });
    const std::string model = model_name(o_.model_dir);
    const auto t0 = Clock::now();
    engine.run(std::move(requests), [&](Completion&& c) {
      if (c.reason == FinishReason::kError) {  // it could never run: it fails alone
        write_error(results, pending_[size_t(c.id)].custom_id, error_code_of(c.failure), c.error);
        return;
      }
      results.append(format_batch_result(result_of(c, model)));
      ++summary_.completed;
      summary_.prompt_tokens += c.prompt_tokens;
      summary_.completion_tokens += int64_t(c.tokens.size());
    });
    summary_.engine_seconds = seconds_since(t0);
    summary_.engine = engine.stats();
    progress.clear();
  }

  static const char* error_code_of(RequestFailure f) {
    switch (f) {
      case RequestFailure::kPromptTooLong:
        return batch_error::kContextLengthExceeded;
      case RequestFailure::kKvCacheTooSmall:
        return batch_error::kKvCacheTooSmall;
      case RequestFailure::kNone:
        break;
    }
    fail("run: the engine failed a request without saying why");
  }

  BatchResult result_of(const Completion& c, const std::string& model) const {
    const Pending& p = pending_[size_t(c.id)];
    CompletionText text = completion_text(c, model_.config.eos_token_ids, *tokenizer_, p.stop);
    BatchResult r;
    r.custom_id = p.custom_id;
    r.endpoint = p.endpoint;
    r.model = model;
    r.created = created_now();
    r.text = std::move(text.text);
    r.finish_reason = text.finish_reason;
    r.prompt_tokens = c.prompt_tokens;
    r.completion_tokens = int(c.tokens.size());
    return r;
  }

  const BatchJobOptions& o_;
  HostBudget budget_;
  Model model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatPrompter> prompter_;
  std::string prompter_error_;
  std::vector<Pending> pending_;
  std::set<std::string> warned_fields_;
  BatchJobSummary summary_;
};

}  // namespace

BatchJobSummary run_batch_job(const BatchJobOptions& options) {
  return Job(options).run();
}

std::string BatchJobSummary::describe() const {
  const double rate = engine_seconds > 0 ? double(completion_tokens) / engine_seconds : 0.0;
  return fmt::format(
      "run: {} requests: {} completed, {} failed, {} skipped as already done ({} of them failed), "
      "{} duplicate lines skipped; {} prompt + {} generated tokens, {:.1f} tokens/s generated; "
      "wall time {:.2f} s",
      requests, completed, failed, already_done, already_failed, duplicates, prompt_tokens,
      completion_tokens, rate, wall_seconds);
}

}  // namespace sluice
