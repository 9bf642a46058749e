// The JSONL formats of `sluice run`: one request per input line, one result per output line.
//
// A request line is either the flat shape
//   {"custom_id": "a", "prompt": "..." | "messages": [...], "max_tokens": 16, "temperature": 0,
//    "top_p": 1, "top_k": 0, "stop": "x" | ["x", "y"], "seed": 1}
// or the OpenAI Batch request shape, with the same fields in "body":
//   {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
//    "body": {...}}
// Result lines follow the OpenAI Batch output shape: {"id", "custom_id", "response": {...},
// "error": null}, or "response": null with "error": {"code", "message"} for a failed request.
//
// Parsing never throws for bad input: a bad line becomes a BatchLine carrying an error, so the
// job can write an error record for it and go on.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

enum class BatchEndpoint { kChatCompletions, kCompletions };

// Error codes written in error records.
namespace batch_error {
inline constexpr const char* kInvalidJson = "invalid_json";        // the line is not JSON
inline constexpr const char* kInvalidRequest = "invalid_request";  // wrong shape, types, values
inline constexpr const char* kInvalidUrl = "invalid_url";          // unsupported method or url
inline constexpr const char* kTemplateError = "template_error";    // the chat template failed
inline constexpr const char* kContextLengthExceeded = "context_length_exceeded";
inline constexpr const char* kKvCacheTooSmall = "kv_cache_too_small";  // no KV pool holds it
}  // namespace batch_error

// One request as the input file states it; absent optional fields take the job's defaults.
struct BatchRequest {
  BatchEndpoint endpoint = BatchEndpoint::kCompletions;
  std::string prompt;                          // completions: text
  std::optional<std::vector<int>> prompt_ids;  // completions: token ids instead of text
  nlohmann::ordered_json messages;             // chat: [{"role", "content", ...}]
  std::optional<int> max_tokens;
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
};

// One input line after parsing: a request, or the error to report for it.
struct BatchLine {
  int line_number = 0;    // 1-based
  std::string custom_id;  // "line-<N>" when the line's own custom_id cannot be read
  std::optional<BatchRequest> request;
  std::string error_code;  // set when request is empty
  std::string error_message;
  std::vector<std::string> unknown_fields;  // ignored fields, as paths ("logprobs", "body.user")
};

BatchLine parse_batch_line(std::string_view line, int line_number);

// The body of one OpenAI API request to `endpoint` (what the Batch shape has in "body"), as an
// HTTP server receives it; the fields in `handled_elsewhere` ("stream", ...) are left to the
// caller. Errors as for a line (error_code, error_message naming the field); custom_id and
// line_number are left empty.
BatchLine parse_request_body(const nlohmann::ordered_json& body, BatchEndpoint endpoint,
                             const std::set<std::string>& handled_elsewhere);

// What the output line of a finished request says.
struct BatchResult {
  std::string custom_id;
  BatchEndpoint endpoint = BatchEndpoint::kCompletions;
  std::string model;    // the name reported in the response body
  int64_t created = 0;  // Unix seconds
  std::string text;
  std::string finish_reason;  // "stop" | "length"
  int prompt_tokens = 0, completion_tokens = 0;
};

// Each returns one complete JSON line, newline included. Ids are derived from the custom_id
// ("batch_req_<hash>", "req_<hash>", "chatcmpl-<hash>" / "cmpl-<hash>"), so a rerun writes the
// same bytes.
std::string format_batch_result(const BatchResult& result);
std::string format_batch_error(const std::string& custom_id, const std::string& code,
                               const std::string& message);

// The custom_id of an output line and whether it records a failure; nullopt when the line is
// not a result line.
struct RecordedResult {
  std::string custom_id;
  bool failed = false;
};
std::optional<RecordedResult> read_result_line(std::string_view line);

// Stable 64-bit hash of a custom_id (FNV-1a), used for ids and default sampling seeds.
uint64_t custom_id_hash(std::string_view custom_id);

}  // namespace sluice
