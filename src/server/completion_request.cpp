#include "server/completion_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "engine/stop_strings.h"
#include "io/batch_format.h"

namespace sluice::server {
namespace {

using Json = nlohmann::ordered_json;

ApiError invalid(std::string message, Json param = nullptr, Json code = nullptr) {
  return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

// The field a parse error message names ("field 'top_p': ..."), for the error's `param`.
Json param_of(const std::string& message) {
  const std::string marker = "field '";
  const size_t at = message.find(marker);
  if (at == std::string::npos) return nullptr;
  const size_t end = message.find('\'', at + marker.size());
  if (end == std::string::npos) return nullptr;
  return message.substr(at + marker.size(), end - at - marker.size());
}

constexpr int kMaxTopLogprobs = 20;

// How many alternatives each token's logprobs list (-1: no logprobs), from the body's fields:
// chat's "logprobs": bool with "top_logprobs": 0-20, the legacy completions' "logprobs": 0-20.
// Empty after an error message naming the field.
std::variant<int, std::string> top_logprobs_asked(const Json& body, bool chat) {
  auto field = [&](const char* name) { return body.contains(name) && !body[name].is_null(); };
  auto count = [&](const char* name) -> std::optional<int> {
    const Json& v = body[name];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTopLogprobs)
      return std::nullopt;
    return int(v.get<int64_t>());
  };
  const std::string range = fmt::format("an integer from 0 to {}", kMaxTopLogprobs);
  if (!chat) {
    if (field("top_logprobs"))
      return "field 'top_logprobs': not a field of /v1/completions (its 'logprobs' is the count)";
    if (!field("logprobs")) return -1;
    if (std::optional<int> n = count("logprobs")) return *n;
    return fmt::format("field 'logprobs': expected {}, got {}", range, body["logprobs"].dump());
  }
  bool wanted = false;
  if (field("logprobs")) {
    if (!body["logprobs"].is_boolean())
      return fmt::format("field 'logprobs': expected true or false, got {}",
                         body["logprobs"].dump());
    wanted = body["logprobs"].get<bool>();
  }
  if (!field("top_logprobs")) return wanted ? 0 : -1;
  if (!wanted) return std::string("field 'top_logprobs': needs 'logprobs': true");
  if (std::optional<int> n = count("top_logprobs")) return *n;
  return fmt::format("field 'top_logprobs': expected {}, got {}", range,
                     body["top_logprobs"].dump());
}


// A boolean field of `object`, absent or null: `otherwise`.
std::variant<bool, ApiError> boolean_field(const Json& object, const char* field,
                                           const char* name, bool otherwise) {
  const auto it = object.find(field);
  if (it == object.end() || it->is_null()) return otherwise;
  if (!it->is_boolean())
    return invalid(fmt::format("field '{}': expected true or false", name), name);
  return it->get<bool>();
}

// The fields the engine's request does not carry: stream, stream_options, log probabilities.
std::variant<CompletionCall, ApiError> parse_call(const Json& body, bool chat) {
  CompletionCall call;
  call.chat = chat;
  if (!body.is_object()) return call;  // parse_request_body names the error
  std::variant<int, std::string> top = top_logprobs_asked(body, chat);
  if (const std::string* error = std::get_if<std::string>(&top))
    return invalid(*error, param_of(*error));
  call.top_logprobs = std::get<int>(top);
  auto stream = boolean_field(body, "stream", "stream", false);
  if (auto* e = std::get_if<ApiError>(&stream)) return *e;
  call.stream = std::get<bool>(stream);
  if (auto so = body.find("stream_options"); so != body.end() && so->is_object()) {
    auto usage = boolean_field(*so, "include_usage", "stream_options.include_usage", false);
    if (auto* e = std::get_if<ApiError>(&usage)) return *e;
    call.include_usage = std::get<bool>(usage);
  }
  return call;
}

// The prompt's token ids: the chat template's, the given ids, or the encoded text.
std::variant<std::vector<int>, ApiError> prompt_of(const BatchRequest& b, const ServedModel& m) {
  if (b.endpoint == BatchEndpoint::kChatCompletions) {
    if (!m.prompter) return invalid(m.prompter_error, "messages");
    try {
      return m.prompter->encode(b.messages);
    } catch (const std::exception& e) {
      return invalid(fmt::format("the chat template failed: {}", e.what()), "messages");
    }
  }
  if (b.prompt_ids) {
    for (int id : *b.prompt_ids)
      if (id < 0 || id >= m.config->vocab_size)
        return invalid(fmt::format("token id {} is outside the vocabulary [0, {})", id,
                                   m.config->vocab_size),
                       "prompt");
    return *b.prompt_ids;
  }
  const std::vector<int32_t> ids = m.tokenizer->encode(b.prompt);
  return std::vector<int>(ids.begin(), ids.end());
}

}  // namespace

std::variant<CompletionRequest, ApiError> parse_completion(std::string_view text, bool chat,
                                                           const ServedModel& model,
                                                           int max_tokens_default, uint64_t seed) {
  Json body;
  try {
    body = Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number too large
    return invalid(fmt::format("the body is not valid JSON ({})", e.what()));
  }
  auto call = parse_call(body, chat);
  if (auto* e = std::get_if<ApiError>(&call)) return *e;
  const BatchEndpoint endpoint =
      chat ? BatchEndpoint::kChatCompletions : BatchEndpoint::kCompletions;
  BatchLine parsed = parse_request_body(
      body, endpoint, {"stream", "stream_options", "logprobs", "top_logprobs", "user"});
  if (!parsed.request) return invalid(parsed.error_message, param_of(parsed.error_message));
  const BatchRequest& b = *parsed.request;

  CompletionRequest out;  // member by member: GCC 12 warns (falsely) on {call, {}, stop}
  out.call = std::get<CompletionCall>(call);
  out.stop = b.stop;
  Request& r = out.request;
  auto prompt = prompt_of(b, model);
  if (auto* e = std::get_if<ApiError>(&prompt)) return *e;
  r.prompt = std::move(std::get<std::vector<int>>(prompt));
  const int tokens = int(r.prompt.size()), context = model.config->max_position_embeddings;
  if (tokens == 0) return invalid("the prompt is empty (0 tokens)", "prompt");
  if (tokens >= context || (b.max_tokens && *b.max_tokens > context - tokens))
    return invalid(fmt::format("this model's context holds {} tokens; the request has {} prompt "
                               "tokens and asks for {} more",
                               context, tokens, b.max_tokens.value_or(1)),
                   "max_tokens", "context_length_exceeded");
  r.max_new_tokens = b.max_tokens.value_or(std::min(max_tokens_default, context - tokens));
  r.sampling.temperature = b.temperature.value_or(1.0f);
  r.sampling.top_p = b.top_p.value_or(1.0f);
  r.sampling.top_k = b.top_k.value_or(0);
  r.sampling.seed = b.seed.value_or(seed);
  r.stop_token_ids = model.config->eos_token_ids;
  r.stop_check = make_stop_check(*model.tokenizer, b.stop);
  r.top_logprobs = out.call.top_logprobs;
  return out;
}

}  // namespace sluice::server
