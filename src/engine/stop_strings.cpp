#include "engine/stop_strings.h"

#include <algorithm>

namespace sluice {

StopStringMatcher::StopStringMatcher(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : stops_(std::move(stops)), decoder_(tokenizer, /*skip_special_tokens=*/true) {
  for (const auto& s : stops_) longest_ = std::max(longest_, s.size());
}

bool StopStringMatcher::matches(std::span<const int> generated) {
  const size_t before = text_.size();
  for (; consumed_ < generated.size(); ++consumed_) text_ += decoder_.push(generated[consumed_]);
  // Only a match ending in the new text is new; it may start up to longest_-1 bytes earlier.
  const size_t from = before >= longest_ ? before - longest_ + 1 : 0;
  for (const auto& s : stops_)
    if (text_.find(s, from) != std::string::npos) return true;
  return false;
}

std::string cut_at_stop_string(std::string text, const std::vector<std::string>& stops,
                               bool* found) {
  size_t cut = std::string::npos;
  for (const auto& s : stops) cut = std::min(cut, text.find(s));
  if (found) *found = cut != std::string::npos;
  if (cut != std::string::npos) text.resize(cut);
  return text;
}

std::function<bool(std::span<const int>)> make_stop_check(const Tokenizer& tokenizer,
                                                          const std::vector<std::string>& stops) {
  if (stops.empty()) return {};
  auto matcher = std::make_shared<StopStringMatcher>(tokenizer, stops);
  return [matcher](std::span<const int> generated) { return matcher->matches(generated); };
}

CompletionText completion_text(const Completion& c, const std::vector<int>& stop_token_ids,
                               const Tokenizer& tokenizer, const std::vector<std::string>& stops) {
  std::vector<int32_t> tokens(c.tokens.begin(), c.tokens.end());
  if (c.reason == FinishReason::kStop && !tokens.empty() &&
      std::find(stop_token_ids.begin(), stop_token_ids.end(), tokens.back()) !=
          stop_token_ids.end())
    tokens.pop_back();
  bool stopped_by_string = false;
  CompletionText out;
  out.text = cut_at_stop_string(tokenizer.decode(tokens, /*skip_special_tokens=*/true), stops,
                                &stopped_by_string);
  if (c.reason == FinishReason::kStop || stopped_by_string) out.finish_reason = "stop";
  return out;
}

}  // namespace sluice
