// What the engine is asked to do and what it returns, independent of any file format. It lives in
// runtime/ because the scheduler admits and finishes requests; the engine above uses it as is.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/sampling.h"

namespace sluice {

struct Request {
  int64_t id = 0;  // the caller's handle; unique within one run
  std::vector<int> prompt;
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int> stop_token_ids;  // usually the model's EOS ids
  bool ignore_eos = false;          // generate exactly max_new_tokens (benchmarks)
  // From this prompt position on, the logits of every prompt position (not only the last, which
  // picks the first generated token) go to the engine's LogitsObserver: the rows `perplexity`
  // scores. -1: none.
  int score_prompt_from = -1;
  // Called after each generated token with all generated tokens so far; returning true ends the
  // sequence with FinishReason::kStop (stop strings, checked on decoded text by the caller).
  std::function<bool(std::span<const int> generated)> stop_check;
  // >= 0: each generated token's log probability is kept (TokenLogprob), with this many of the
  // most likely alternatives. -1: none.
  int top_logprobs = -1;
  // Called after each generated token, before stop_check, with all generated tokens so far and
  // (with top_logprobs >= 0) their log probabilities: a streaming caller's view.
  std::function<void(std::span<const int> generated, std::span<const TokenLogprob> logprobs)>
      on_generated;
};

// kError: the request could never run (see RequestFailure) and failed alone, generating nothing.
enum class FinishReason { kStop, kLength, kError };
inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

// Why a request failed alone (FinishReason::kError).
enum class RequestFailure {
  kNone,
  kPromptTooLong,    // the prompt leaves no position of the model's context to generate in
  kKvCacheTooSmall,  // its whole sequence needs more KV blocks than the largest KV pool has
};
inline const char* request_failure_code(RequestFailure f) {
  switch (f) {
    case RequestFailure::kNone:
      return "none";
    case RequestFailure::kPromptTooLong:
      return "prompt_too_long";
    case RequestFailure::kKvCacheTooSmall:
      return "kv_cache_too_small";
  }
  return "?";
}

struct Completion {
  int64_t id = 0;
  std::vector<int> tokens;  // generated tokens, the stop token included when one ended it
  std::vector<TokenLogprob> logprobs;  // one per token, when the request asked for them
  FinishReason reason = FinishReason::kLength;
  int prompt_tokens = 0;
  // With FinishReason::kError: why, and a message naming the sizes that did not fit.
  RequestFailure failure = RequestFailure::kNone;
  std::string error;
};

}  // namespace sluice
