#include "server/request_state.h"

#include <algorithm>
#include <chrono>

#include "engine/stop_strings.h"

namespace sluice::server {
namespace {

// The largest n <= want such that text[0, n) does not end inside a UTF-8 character.
size_t utf8_boundary(const std::string& text, size_t want) {
  while (want > 0 && want < text.size() && (static_cast<unsigned char>(text[want]) & 0xC0) == 0x80)
    --want;
  return want;
}

}  // namespace

RequestState::RequestState(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : tokenizer_(tokenizer), stops_(std::move(stops)), decoder_(tokenizer, true) {
  for (const std::string& s : stops_) hold_back_ = std::max(hold_back_, s.size() - 1);
}

void RequestState::on_tokens(std::span<const int> generated,
                             std::span<const TokenLogprob> logprobs) {
  std::lock_guard lock(mutex_);
  generated_.assign(generated.begin(), generated.end());
  if (!logprobs.empty()) logprobs_.push_back(logprobs.back());
  changed_.notify_all();
}

void RequestState::on_finished(Completion&& c) {
  std::lock_guard lock(mutex_);
  generated_ = c.tokens;
  completion_ = std::move(c);
  changed_.notify_all();
}

void RequestState::decode_new_tokens(const std::vector<int>& tokens) {
  for (; decoded_tokens_ < tokens.size(); ++decoded_tokens_)
    text_ += decoder_.push(tokens[decoded_tokens_]);
}

RequestState::Delta RequestState::next_delta(int timeout_ms) {
  std::vector<int> tokens;
  bool finished = false;
  Delta d;
  {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
      return completion_.has_value() || generated_.size() > decoded_tokens_;
    });
    tokens = generated_;
    finished = completion_.has_value();
    d.logprobs.swap(logprobs_);
  }
  decode_new_tokens(tokens);
  if (finished) text_ += decoder_.flush();
  bool stopped = false;
  const std::string cut = cut_at_stop_string(text_, stops_, &stopped);
  size_t end = cut.size();
  if (!finished && !stopped) end = utf8_boundary(cut, end > hold_back_ ? end - hold_back_ : 0);
  if (end > sent_) {
    d.text = cut.substr(sent_, end - sent_);
    sent_ = end;
  }
  d.done = finished;
  if (finished) {
    const FinishReason r = completion_->reason;
    finish_reason_ = r == FinishReason::kError                  ? "error"
                     : r == FinishReason::kStop || stopped ? "stop"
                                                                : "length";
  }
  return d;
}

RequestState::Delta RequestState::wait_whole(const std::function<bool()>& gone) {
  Delta whole;
  for (;;) {
    if (gone()) return whole;
    Delta d = next_delta(200);
    whole.text += d.text;
    whole.logprobs.insert(whole.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    if (d.done) {
      whole.done = true;
      return whole;
    }
  }
}

}  // namespace sluice::server
