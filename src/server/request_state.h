// One HTTP request's view of its sequence: the OnlineListener the engine thread feeds, and the
// text the handler thread sends. Text is decoded as the batch job decodes it (special tokens
// skipped, cut before the earliest stop string); a stream holds back the last bytes that could
// still begin a stop string, so it never sends text the final answer would not contain.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/online_session.h"
#include "io/tokenizer.h"

namespace sluice::server {

class RequestState : public OnlineListener {
 public:
  RequestState(const Tokenizer& tokenizer, std::vector<std::string> stops);

  void on_tokens(std::span<const int> generated, std::span<const TokenLogprob> logprobs) override;
  void on_finished(Completion&& c) override;

  // Waits up to `timeout_ms` for news; then the text not yet sent (held back near a possible stop
  // string until the end) and, once the sequence has ended, `done`.
  // `logprobs`: those of the tokens generated since the last delta (when the request asked for
  // them); they run ahead of `text` while text is held back.
  struct Delta {
    std::string text;
    std::vector<TokenLogprob> logprobs;
    bool done = false;
  };
  Delta next_delta(int timeout_ms);
  // Blocks until the sequence ends; its whole text and logprobs. Returns early, not done, once
  // `gone()` (asked every 200 ms at most) says the client went away.
  Delta wait_whole(const std::function<bool()>& gone);

  // Valid once done: "stop" / "length", or "error" with error().
  const std::string& finish_reason() const { return finish_reason_; }
  const std::string& error() const { return completion_->error; }
  int prompt_tokens() const { return completion_->prompt_tokens; }
  int completion_tokens() const { return int(completion_->tokens.size()); }

 private:
  void decode_new_tokens(const std::vector<int>& tokens);

  const Tokenizer& tokenizer_;
  const std::vector<std::string> stops_;
  size_t hold_back_ = 0;  // longest stop string - 1

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int> generated_;  // latest copy from the engine thread
  std::vector<TokenLogprob> logprobs_;  // from on_tokens (each token's, the last one included), not yet taken by next_delta
  std::optional<Completion> completion_;

  // The handler thread's.
  StreamingDecoder decoder_;
  size_t decoded_tokens_ = 0;
  std::string text_;
  size_t sent_ = 0;
  std::string finish_reason_;
};

}  // namespace sluice::server
