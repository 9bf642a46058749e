// The JSONL formats of `sluice run`: request lines of both shapes, every kind of bad line, and
// result lines.
#include "io/batch_format.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using Json = nlohmann::ordered_json;

BatchLine parse(const std::string& text, int line_number = 3) {
  return parse_batch_line(text, line_number);
}

// Expects a bad line: its error code, and a message naming the line and containing `mentions`.
void expect_bad(const std::string& text, const std::string& code, const std::string& mentions,
                const std::string& custom_id = "x") {
  BatchLine line = parse(text);
  EXPECT_FALSE(line.request) << text;
  EXPECT_EQ(line.error_code, code) << text;
  EXPECT_EQ(line.custom_id, custom_id) << text;
  EXPECT_NE(line.error_message.find("line 3: "), std::string::npos) << line.error_message;
  EXPECT_NE(line.error_message.find(mentions), std::string::npos)
      << "message '" << line.error_message << "' does not mention '" << mentions << "'";
}

TEST(BatchFormat, FlatCompletionWithEveryField) {
  BatchLine line =
      parse(R"({"custom_id": "a", "prompt": "Hello", "max_tokens": 7, "temperature": 0.5,)"
            R"( "top_p": 0.9, "top_k": 40, "stop": "\n", "seed": 11, "model": "m", "n": 1})");
  ASSERT_TRUE(line.request) << line.error_message;
  const BatchRequest& r = *line.request;
  EXPECT_EQ(line.custom_id, "a");
  EXPECT_EQ(r.endpoint, BatchEndpoint::kCompletions);
  EXPECT_EQ(r.prompt, "Hello");
  EXPECT_FALSE(r.prompt_ids);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(*r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.seed, 11u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(line.unknown_fields.empty());  // "model" and "n": 1 are understood
}

TEST(BatchFormat, FlatChatKeepsMessagesInOrder) {
  BatchLine line =
      parse(R"({"custom_id": "c", "messages": [{"role": "system", "content": "Be brief"},)"
            R"( {"role": "user", "content": "Hi", "name": "u"}], "stop": ["A", "B"]})");
  ASSERT_TRUE(line.request) << line.error_message;
  EXPECT_EQ(line.request->endpoint, BatchEndpoint::kChatCompletions);
  ASSERT_EQ(line.request->messages.size(), 2u);
  EXPECT_EQ(line.request->messages[1].dump(), R"({"role":"user","content":"Hi","name":"u"})");
  EXPECT_EQ(line.request->stop, (std::vector<std::string>{"A", "B"}));
  EXPECT_FALSE(line.request->max_tokens);
  EXPECT_FALSE(line.request->temperature);
}

TEST(BatchFormat, OpenAIBatchShapes) {
  BatchLine chat =
      parse(R"({"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",)"
            R"( "body": {"model": "gpt-x", "messages": [{"role": "user", "content": "Hi"}],)"
            R"( "max_completion_tokens": 9, "temperature": null}})");
  ASSERT_TRUE(chat.request) << chat.error_message;
  EXPECT_EQ(chat.custom_id, "r1");
  EXPECT_EQ(chat.request->endpoint, BatchEndpoint::kChatCompletions);
  EXPECT_EQ(chat.request->max_tokens, 9);
  EXPECT_FALSE(chat.request->temperature);  // null: the default

  BatchLine text = parse(R"({"custom_id": "r2", "method": "POST", "url": "/v1/completions",)"
                         R"( "body": {"prompt": [1, 5, 300], "max_tokens": 2}})");
  ASSERT_TRUE(text.request) << text.error_message;
  EXPECT_EQ(text.request->endpoint, BatchEndpoint::kCompletions);
  EXPECT_EQ(text.request->prompt_ids, (std::vector<int>{1, 5, 300}));
}

TEST(BatchFormat, UnknownFieldsAreListedNotRejected) {
  BatchLine flat = parse(R"({"custom_id": "a", "prompt": "x", "logprobs": true, "user": "u"})");
  ASSERT_TRUE(flat.request);
  EXPECT_EQ(flat.unknown_fields, (std::vector<std::string>{"logprobs", "user"}));

  BatchLine batch =
      parse(R"({"custom_id": "b", "method": "POST", "url": "/v1/completions", "extra": 1,)"
            R"( "body": {"prompt": "x", "presence_penalty": 0.5}})");
  ASSERT_TRUE(batch.request);
  EXPECT_EQ(batch.unknown_fields, (std::vector<std::string>{"extra", "body.presence_penalty"}));
}

TEST(BatchFormat, LinesWithoutAReadableCustomIdGetALineNumberId) {
  expect_bad("{not json", batch_error::kInvalidJson, "not valid JSON", "line-3");
  expect_bad("", batch_error::kInvalidJson, "not valid JSON", "line-3");
  expect_bad(R"(["custom_id", "a"])", batch_error::kInvalidRequest, "expected a JSON object",
             "line-3");
  expect_bad(R"({"prompt": "x"})", batch_error::kInvalidRequest, "field 'custom_id'", "line-3");
  expect_bad(R"({"custom_id": 5, "prompt": "x"})", batch_error::kInvalidRequest,
             "field 'custom_id': expected a non-empty string, got 5", "line-3");
  expect_bad(R"({"custom_id": "", "prompt": "x"})", batch_error::kInvalidRequest,
             "field 'custom_id'", "line-3");
}

TEST(BatchFormat, WrongTypesAndValuesNameTheField) {
  const std::string head = R"({"custom_id": "x", "prompt": "p", )";
  expect_bad(head + R"("max_tokens": 0})", batch_error::kInvalidRequest,
             "field 'max_tokens': expected an integer >= 1, got 0");
  expect_bad(head + R"("max_tokens": "ten"})", batch_error::kInvalidRequest,
             "field 'max_tokens': expected an integer >= 1, got \"ten\"");
  expect_bad(head + R"("max_tokens": 2.5})", batch_error::kInvalidRequest, "field 'max_tokens'");
  expect_bad(head + R"("temperature": -1})", batch_error::kInvalidRequest,
             "field 'temperature': expected a number >= 0");
  expect_bad(head + R"("temperature": "hot"})", batch_error::kInvalidRequest,
             "field 'temperature'");
  expect_bad(head + R"("top_p": 0})", batch_error::kInvalidRequest,
             "field 'top_p': expected a number in (0, 1]");
  expect_bad(head + R"("top_p": 1.5})", batch_error::kInvalidRequest, "field 'top_p'");
  expect_bad(head + R"("temperature": 1e300})", batch_error::kInvalidRequest,
             "field 'temperature': expected a number >= 0, got 1e+300");  // beyond float
  expect_bad(head + R"("top_k": -2})", batch_error::kInvalidRequest, "field 'top_k'");
  expect_bad(head + R"("top_k": 18446744073709551615})", batch_error::kInvalidRequest,
             "field 'top_k'");  // was read as -1, "no limit"
  expect_bad(head + R"("seed": "s"})", batch_error::kInvalidRequest,
             "field 'seed': expected an integer");
  expect_bad(head + R"("stop": 3})", batch_error::kInvalidRequest, "field 'stop'");
  expect_bad(head + R"("stop": ["a", 3]})", batch_error::kInvalidRequest, "field 'stop'");
  expect_bad(head + R"("stop": ""})", batch_error::kInvalidRequest, "field 'stop'");
  expect_bad(head + R"("n": 2})", batch_error::kInvalidRequest, "field 'n': expected 1");
  expect_bad(R"({"custom_id": "x", "prompt": ["a", "b"]})", batch_error::kInvalidRequest,
             "field 'prompt': expected a string or a non-empty list of token ids");
  expect_bad(R"({"custom_id": "x", "prompt": [1, -1]})", batch_error::kInvalidRequest,
             "field 'prompt'");
  expect_bad(R"({"custom_id": "x", "prompt": []})", batch_error::kInvalidRequest, "field 'prompt'");
  expect_bad(R"({"custom_id": "x", "messages": []})", batch_error::kInvalidRequest,
             "field 'messages'");
  expect_bad(R"({"custom_id": "x", "messages": "Hi"})", batch_error::kInvalidRequest,
             "field 'messages'");
  expect_bad(R"({"custom_id": "x", "messages": [{"content": "Hi"}]})", batch_error::kInvalidRequest,
             "field 'messages[0].role': expected a string");
  expect_bad(R"({"custom_id": "x", "messages": ["Hi"]})", batch_error::kInvalidRequest,
             "field 'messages[0]'");
}

TEST(BatchFormat, MissingOrDoublePromptIsAnError) {
  expect_bad(R"({"custom_id": "x", "max_tokens": 3})", batch_error::kInvalidRequest,
             "expected a 'prompt' or a 'messages' field");
  expect_bad(R"({"custom_id": "x", "prompt": "a", "messages": [{"role": "user"}]})",
             batch_error::kInvalidRequest, "both given");
  expect_bad(R"({"custom_id": "x", "prompt": null})", batch_error::kInvalidRequest,
             "expected a 'prompt' or a 'messages' field");
  expect_bad(R"({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",)"
             R"( "body": {"prompt": "a"}})",
             batch_error::kInvalidRequest, "field 'body.messages' is missing");
  expect_bad(R"({"custom_id": "x", "method": "POST", "url": "/v1/completions",)"
             R"( "body": {"messages": [{"role": "user", "content": "a"}]}})",
             batch_error::kInvalidRequest, "field 'body.prompt' is missing");
}

TEST(BatchFormat, BadOpenAIEnvelope) {
  expect_bad(R"({"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {}})",
             batch_error::kInvalidUrl, "field 'url'");
  expect_bad(R"({"custom_id": "x", "method": "POST", "body": {"prompt": "a"}})",
             batch_error::kInvalidUrl, "field 'url'");
  expect_bad(R"({"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {}})",
             batch_error::kInvalidUrl, "field 'method': expected \"POST\"");
  expect_bad(R"({"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "a"}})",
             batch_error::kInvalidUrl, "field 'method'");
  expect_bad(R"({"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": "a"})",
             batch_error::kInvalidRequest, "field 'body': expected an object");
  expect_bad(R"({"custom_id": "x", "method": "POST", "url": "/v1/completions",)"
             R"( "body": {"prompt": "a", "max_tokens": -4}})",
             batch_error::kInvalidRequest, "field 'body.max_tokens'");
}

TEST(BatchFormat, ResultLineHasTheOpenAIBatchShape) {
  BatchResult r;
  r.custom_id = "q-1";
  r.endpoint = BatchEndpoint::kChatCompletions;
  r.model = "tiny";
  r.created = 1700000000;
  r.text = "Hé\n\"quoted\"";
  r.finish_reason = "stop";
  r.prompt_tokens = 12;
  r.completion_tokens = 5;
  const std::string line = format_batch_result(r);
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);  // exactly one line
  const std::string hash = fmt::format("{:016x}", custom_id_hash("q-1"));
  EXPECT_EQ(
      line,
      R"({"id":"batch_req_)" + hash +
          R"(","custom_id":"q-1","response":{"status_code":200,)"
          R"("request_id":"req_)" +
          hash + R"(","body":{"id":"chatcmpl-)" + hash +
          R"(","object":"chat.completion","created":1700000000,"model":"tiny",)"
          R"("choices":[{"index":0,"message":{"role":"assistant","content":"Hé\n\"quoted\""},)"
          R"("logprobs":null,"finish_reason":"stop"}],)"
          R"("usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}},)"
          R"("error":null})"
          "\n");

  r.endpoint = BatchEndpoint::kCompletions;
  r.finish_reason = "length";
  Json text = Json::parse(format_batch_result(r));
  const Json& body = text["response"]["body"];
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["id"], "cmpl-" + hash);
  EXPECT_EQ(body["choices"][0]["text"], r.text);
  EXPECT_FALSE(body["choices"][0].contains("message"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
}

TEST(BatchFormat, ErrorLineAndReadingBack) {
  const std::string line = format_batch_error("line-4", "invalid_json", "line 4: not valid JSON");
  Json j = Json::parse(line);
  EXPECT_EQ(j["custom_id"], "line-4");
  EXPECT_TRUE(j["response"].is_null());
  EXPECT_EQ(j["error"], (Json{{"code", "invalid_json"}, {"message", "line 4: not valid JSON"}}));
  EXPECT_EQ(j["id"], fmt::format("batch_req_{:016x}", custom_id_hash("line-4")));

  auto failed = read_result_line(line);
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->custom_id, "line-4");
  EXPECT_TRUE(failed->failed);

  BatchResult r;
  r.custom_id = "ok";
  r.finish_reason = "stop";
  auto ok = read_result_line(format_batch_result(r));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->custom_id, "ok");
  EXPECT_FALSE(ok->failed);

  EXPECT_FALSE(read_result_line(R"({"id": "x"})"));
  EXPECT_FALSE(read_result_line(R"({"custom_id": "x", "resp)"));
  EXPECT_FALSE(read_result_line("[]"));
}

TEST(BatchFormat, IdsAreStableAndDistinct) {
  EXPECT_EQ(custom_id_hash("a"), custom_id_hash("a"));
  EXPECT_NE(custom_id_hash("a"), custom_id_hash("b"));
  EXPECT_EQ(custom_id_hash(""), 0xcbf29ce484222325ull);  // FNV-1a offset basis
}

}  // namespace
}  // namespace sluice
