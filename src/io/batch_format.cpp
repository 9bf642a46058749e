#include "io/batch_format.h"

#include <fmt/format.h>

#include <climits>
#include <set>

#include "io/json_number.h"

namespace sluice {
namespace {

using Json = nlohmann::ordered_json;

// Thrown inside the parser and turned into the line's error record.
struct LineError {
  const char* code;
  std::string message;
};

[[noreturn]] void reject(const std::string& field, const std::string& expected, const Json& got) {
  throw LineError{batch_error::kInvalidRequest, fmt::format("field '{}': expected {}, got {}",
                                                            field, expected, json_excerpt(got))};
}

bool is_integer(const Json& v) {
  return v.is_number_integer() || v.is_number_unsigned();
}

int read_positive_int(const Json& v, const std::string& field) {
  const auto i = json_integer(v, 1, INT_MAX);
  if (!i) reject(field, "an integer >= 1", v);
  return int(*i);
}

float read_number(const Json& v, const std::string& field, const std::string& expected) {
  const auto f = json_float(v);
  if (!f) reject(field, expected, v);
  return *f;
}

std::vector<std::string> read_stop(const Json& v, const std::string& field) {
  const char* expected = "a non-empty string or a list of non-empty strings";
  if (v.is_string()) {
    if (v.get<std::string>().empty()) reject(field, expected, v);
    return {v.get<std::string>()};
  }
  if (!v.is_array()) reject(field, expected, v);
  std::vector<std::string> stops;
  for (const Json& s : v) {
    if (!s.is_string() || s.get<std::string>().empty()) reject(field, expected, v);
    stops.push_back(s.get<std::string>());
  }
  return stops;
}

void read_prompt(const Json& v, const std::string& field, BatchRequest& r) {
  if (v.is_string()) {
    r.prompt = v.get<std::string>();
    return;
  }
  const char* expected = "a string or a non-empty list of token ids";
  if (!v.is_array() || v.empty()) reject(field, expected, v);
  std::vector<int> ids;
  for (const Json& id : v) {
    const auto i = json_integer(id, 0, INT_MAX);
    if (!i) reject(field, expected, v);
    ids.push_back(int(*i));
  }
  r.prompt_ids = std::move(ids);
}

void read_messages(const Json& v, const std::string& field, BatchRequest& r) {
  const char* expected = "a non-empty list of {\"role\": string, \"content\": ...} objects";
  if (!v.is_array() || v.empty()) reject(field, expected, v);
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string item = fmt::format("{}[{}]", field, i);
    if (!v[i].is_object()) reject(item, "an object with a 'role' string", v[i]);
    auto role = v[i].find("role");
    if (role == v[i].end() || !role->is_string())
      reject(item + ".role", "a string", role == v[i].end() ? Json() : *role);
  }
  r.messages = v;
}

// Reads the generation fields shared by both shapes. `prefix` is "" or "body." (for messages);
// `allowed_prompt_fields` lists which of "prompt" / "messages" this shape accepts.
void read_fields(const Json& object, const std::string& prefix,
                 const std::set<std::string>& allowed_prompt_fields, BatchLine& line,
                 BatchRequest& r) {
  for (const auto& [key, value] : object.items()) {
    const std::string field = prefix + key;
    if (key == "custom_id" && prefix.empty()) continue;
    if (value.is_null()) continue;  // null means "use the default", as in the OpenAI API
    if (allowed_prompt_fields.count(key)) {
      if (key == "prompt") read_prompt(value, field, r);
      if (key == "messages") read_messages(value, field, r);
      continue;
    }
    if (key == "max_tokens" || key == "max_completion_tokens") {
      r.max_tokens = read_positive_int(value, field);
    } else if (key == "temperature") {
      r.temperature = read_number(value, field, "a number >= 0");
      if (*r.temperature < 0) reject(field, "a number >= 0", value);
    } else if (key == "top_p") {
      r.top_p = read_number(value, field, "a number in (0, 1]");
      if (!(*r.top_p > 0 && *r.top_p <= 1)) reject(field, "a number in (0, 1]", value);
    } else if (key == "top_k") {
      // -1 is vLLM's spelling of "no limit".
      const auto k = json_integer(value, -1, INT_MAX);
      if (!k) reject(field, "an integer >= 0 (or -1 for no limit)", value);
      r.top_k = std::max(0, int(*k));
    } else if (key == "seed") {
      if (!is_integer(value)) reject(field, "an integer", value);
      r.seed = value.is_number_unsigned() ? value.get<uint64_t>() : uint64_t(value.get<int64_t>());
    } else if (key == "stop") {
      r.stop = read_stop(value, field);
    } else if (key == "n") {
      if (json_integer(value, 1, 1) != 1) reject(field, "1 (one choice per request)", value);
    } else if (key == "model") {
      // The model is the one given on the command line.
    } else {
      line.unknown_fields.push_back(field);
    }
  }
}

void require_prompt(const BatchRequest& r, const Json& object, const std::string& prefix) {
  const std::string field =
      prefix + (r.endpoint == BatchEndpoint::kChatCompletions ? "messages" : "prompt");
  auto it = object.find(r.endpoint == BatchEndpoint::kChatCompletions ? "messages" : "prompt");
  if (it == object.end() || it->is_null())
    throw LineError{batch_error::kInvalidRequest, fmt::format("field '{}' is missing", field)};
}

BatchRequest parse_flat(const Json& object, BatchLine& line) {
  BatchRequest r;
  const bool has_prompt = object.contains("prompt") && !object["prompt"].is_null();
  const bool has_messages = object.contains("messages") && !object["messages"].is_null();
  if (has_prompt == has_messages)
    throw LineError{batch_error::kInvalidRequest,
                    has_prompt ? "fields 'prompt' and 'messages' are both given; expected one"
                               : "expected a 'prompt' or a 'messages' field, found neither"};
  r.endpoint = has_messages ? BatchEndpoint::kChatCompletions : BatchEndpoint::kCompletions;
  read_fields(object, "", {"prompt", "messages"}, line, r);
  return r;
}

BatchRequest parse_openai_batch(const Json& object, BatchLine& line) {
  for (const auto& [key, value] : object.items())
    if (key != "custom_id" && key != "method" && key != "url" && key != "body")
      line.unknown_fields.push_back(key);
  auto method = object.find("method");
  if (method == object.end() || *method != "POST")
    throw LineError{batch_error::kInvalidUrl,
                    fmt::format("field 'method': expected \"POST\", got {}",
                                method == object.end() ? "nothing" : method->dump())};
  auto url = object.find("url");
  BatchRequest r;
  if (url != object.end() && *url == "/v1/chat/completions") {
    r.endpoint = BatchEndpoint::kChatCompletions;
  } else if (url != object.end() && *url == "/v1/completions") {
    r.endpoint = BatchEndpoint::kCompletions;
  } else {
    throw LineError{batch_error::kInvalidUrl,
                    fmt::format("field 'url': expected \"/v1/chat/completions\" or "
                                "\"/v1/completions\", got {}",
                                url == object.end() ? "nothing" : url->dump())};
  }
  auto body = object.find("body");
  if (body == object.end() || !body->is_object())
    reject("body", "an object", body == object.end() ? Json() : *body);
  require_prompt(r, *body, "body.");
  read_fields(*body, "body.",
              {r.endpoint == BatchEndpoint::kChatCompletions ? "messages" : "prompt"}, line, r);
  return r;
}

std::string hex_id(std::string_view custom_id) {
  return fmt::format("{:016x}", custom_id_hash(custom_id));
}

std::string dump_line(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace

uint64_t custom_id_hash(std::string_view custom_id) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : custom_id) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

BatchLine parse_batch_line(std::string_view text, int line_number) {
  BatchLine line;
  line.line_number = line_number;
  line.custom_id = fmt::format("line-{}", line_number);
  auto fail_line = [&](const char* code, const std::string& message) {
    line.error_code = code;
    line.error_message = fmt::format("line {}: {}", line_number, message);
    line.request.reset();
    return line;
  };
  Json object;
  try {
    object = Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number too large
    return fail_line(batch_error::kInvalidJson, fmt::format("not valid JSON ({})", e.what()));
  }
  if (!object.is_object())
    return fail_line(batch_error::kInvalidRequest,
                     fmt::format("expected a JSON object, got {}", object.type_name()));
  try {
    auto id = object.find("custom_id");
    if (id == object.end() || !id->is_string() || id->get<std::string>().empty())
      reject("custom_id", "a non-empty string", id == object.end() ? Json() : *id);
    line.custom_id = id->get<std::string>();
    const bool openai_shape =
        object.contains("url") || object.contains("method") || object.contains("body");
    line.request = openai_shape ? parse_openai_batch(object, line) : parse_flat(object, line);
  } catch (const LineError& e) {
    return fail_line(e.code, e.message);
  }
  return line;
}

BatchLine parse_request_body(const nlohmann::ordered_json& body, BatchEndpoint endpoint,
                             const std::set<std::string>& handled_elsewhere) {
  BatchLine line;
  BatchRequest r;
  r.endpoint = endpoint;
  try {
    if (!body.is_object()) reject("body", "a JSON object", body);
    require_prompt(r, body, "");
    Json fields = body;
    for (const std::string& key : handled_elsewhere) fields.erase(key);
    read_fields(fields, "", {endpoint == BatchEndpoint::kChatCompletions ? "messages" : "prompt"},
                line, r);
  } catch (const LineError& e) {
    line.error_code = e.code;
    line.error_message = e.message;
    return line;
  }
  line.request = std::move(r);
  return line;
}

std::string format_batch_result(const BatchResult& r) {
  const bool chat = r.endpoint == BatchEndpoint::kChatCompletions;
  const std::string hash = hex_id(r.custom_id);
  Json choice = {{"index", 0}};
  if (chat)
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
  else
    choice["text"] = r.text;
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = r.finish_reason;
  Json body = {{"id", (chat ? "chatcmpl-" : "cmpl-") + hash},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", r.created},
               {"model", r.model},
               {"choices", Json::array({choice})},
               {"usage",
                {{"prompt_tokens", r.prompt_tokens},
                 {"completion_tokens", r.completion_tokens},
                 {"total_tokens", r.prompt_tokens + r.completion_tokens}}}};
  Json line = {{"id", "batch_req_" + hash},
               {"custom_id", r.custom_id},
               {"response", {{"status_code", 200}, {"request_id", "req_" + hash}, {"body", body}}},
               {"error", nullptr}};
  return dump_line(line);
}

std::string format_batch_error(const std::string& custom_id, const std::string& code,
                               const std::string& message) {
  Json line = {{"id", "batch_req_" + hex_id(custom_id)},
               {"custom_id", custom_id},
               {"response", nullptr},
               {"error", {{"code", code}, {"message", message}}}};
  return dump_line(line);
}

std::optional<RecordedResult> read_result_line(std::string_view text) {
  Json line = Json::parse(text, nullptr, false);
  if (line.is_discarded() || !line.is_object()) return std::nullopt;
  auto id = line.find("custom_id");
  if (id == line.end() || !id->is_string()) return std::nullopt;
  RecordedResult r;
  r.custom_id = id->get<std::string>();
  auto error = line.find("error");
  auto response = line.find("response");
  const bool ok = response != line.end() && response->is_object() &&
                  response->contains("status_code") && (*response)["status_code"] == 200;
  r.failed = (error != line.end() && !error->is_null()) || !ok;
  return r;
}

}  // namespace sluice
