// A /v1/completions or /v1/chat/completions body, parsed and checked against the served model
// into the engine's Request: all the server does with a completion request before the engine
// sees it, without sockets (the fuzz target server_request calls it as the server does). Errors
// come back in OpenAI's terms (status, message, type, param, code) for the server to send.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "io/chat_prompt.h"
#include "io/tokenizer.h"
#include "model/config.h"
#include "runtime/request.h"

namespace sluice::server {

// What the server serves; all outlive it.
struct ServedModel {
  const ModelConfig* config = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatPrompter* prompter = nullptr;  // null: the model has no chat template
  std::string prompter_error;             // why, for chat requests
};

// What one completion request asked for beyond the engine's Request.
struct CompletionCall {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  int top_logprobs = -1;   // -1: no logprobs
  size_t text_offset = 0;  // the legacy completions' text_offset of the next token
  std::string id;        // set by the server once the request is admitted
  int64_t created = 0;   // Unix seconds, likewise
};

struct CompletionRequest {
  CompletionCall call;
  Request request;
  std::vector<std::string> stop;  // stop strings
};

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  nlohmann::ordered_json param, code;  // null when none
};

// `body` of a chat (`chat`) or text completion; `max_tokens_default` where the body gives no
// max_tokens, `seed` where it gives no seed. Throws nothing but std::bad_alloc.
std::variant<CompletionRequest, ApiError> parse_completion(std::string_view body, bool chat,
                                                           const ServedModel& model,
                                                           int max_tokens_default, uint64_t seed);

}  // namespace sluice::server
