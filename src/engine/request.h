// What the engine is asked to do and what it returns, independent of any file format.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/sampling.h"

namespace sluice {

struct Request {
  int64_t id = 0;  // the caller's handle; unique within one run
  std::vector<int> prompt;
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int> stop_token_ids;  // usually the model's EOS ids
  bool ignore_eos = false;          // generate exactly max_new_tokens (benchmarks)
  // Called after each generated token with all generated tokens so far; returning true ends the
  // sequence with FinishReason::kStop (stop strings, checked on decoded text by the caller).
  std::function<bool(std::span<const int> generated)> stop_check;
};

enum class FinishReason { kStop, kLength };
inline const char* finish_reason_name(FinishReason r) {
  return r == FinishReason::kStop ? "stop" : "length";
}

struct Completion {
  int64_t id = 0;
  std::vector<int> tokens;  // generated tokens, the stop token included when one ended it
  FinishReason reason = FinishReason::kLength;
  int prompt_tokens = 0;
};

}  // namespace sluice
