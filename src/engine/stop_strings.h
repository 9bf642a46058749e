// Stop strings: a sequence ends once its decoded text contains one of them, and the returned text
// ends just before the earliest one (the OpenAI API's `stop`). The engine asks after every token
// (Request::stop_check); decoding is incremental, so each check costs one token's decode.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "runtime/request.h"

namespace sluice {

class StopStringMatcher {
 public:
  // Decodes with skip_special_tokens, as the result text is decoded.
  StopStringMatcher(const Tokenizer& tokenizer, std::vector<std::string> stops);

  // `generated`: every token generated so far (the engine passes the whole list each time).
  // True once the decoded text contains a stop string.
  bool matches(std::span<const int> generated);

 private:
  std::vector<std::string> stops_;
  size_t longest_ = 0;
  StreamingDecoder decoder_;
  std::string text_;
  size_t consumed_ = 0;  // tokens of `generated` already decoded
};

// `text` cut before the earliest occurrence of any stop string; `found` tells whether one was.
std::string cut_at_stop_string(std::string text, const std::vector<std::string>& stops,
                               bool* found);

// The text a finished completion returns: its tokens decoded without the stop token that ended it
// (one of `stop_token_ids`) and without special tokens, cut before the earliest stop string; and
// its finish reason, "stop" (a stop token or string) or "length".
struct CompletionText {
  std::string text;
  const char* finish_reason = "length";
};
CompletionText completion_text(const Completion& c, const std::vector<int>& stop_token_ids,
                               const Tokenizer& tokenizer, const std::vector<std::string>& stops);

// A Request::stop_check for `stops` (empty function when there are none).
std::function<bool(std::span<const int>)> make_stop_check(const Tokenizer& tokenizer,
                                                          const std::vector<std::string>& stops);

}  // namespace sluice
