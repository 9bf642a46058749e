// `sluice run` end to end on a tiny random model, through the built binary: both request shapes,
// bad lines, one result per custom_id, determinism, resuming after SIGKILL and after a torn last
// line, stop strings, fatal errors. Also the pieces it is built from that need a tokenizer: stop
// string matching, chat prompts, the results file.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "engine/stop_strings.h"
#include "io/batch_format.h"
#include "io/chat_prompt.h"
#include "io/results_file.h"
#include "io/tokenizer.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::CommandResult;
using testing::TempDir;
using testing::write_file;

// `created` pinned so that output files compare byte for byte.
constexpr const char* kPinnedTime = "1700000000";

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> split_lines(const std::string& bytes) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = bytes.find('\n', start)) != std::string::npos; start = end + 1)
    lines.push_back(bytes.substr(start, end - start));
  return lines;
}

// The output's results by custom_id; fails the test when a custom_id appears twice.
std::map<std::string, Json> results_by_id(const fs::path& output) {
  std::map<std::string, Json> by_id;
  for (const std::string& line : split_lines(read_bytes(output))) {
    Json j = Json::parse(line);
    const std::string id = j["custom_id"];
    EXPECT_TRUE(by_id.emplace(id, j).second) << "custom_id " << id << " appears twice";
  }
  return by_id;
}

std::string completion_text(const Json& result) {
  const Json& choice = result["response"]["body"]["choices"][0];
  return choice.contains("message") ? choice["message"]["content"] : choice["text"];
}

class BatchJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    write_random_checkpoint(preset_config("tiny-mixtral"), model_dir(), 7);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path model_dir() { return dir_->path() / "tiny"; }

  std::string run_args(const fs::path& input, const fs::path& output,
                       const std::string& extra) const {
    return fmt::format("run --model {} --input {} --output {} --threads 1 {}", model_dir().string(),
                       input.string(), output.string(), extra);
  }
  CommandResult run_job(const fs::path& input, const fs::path& output,
                        const std::string& extra = "") const {
    return testing::run_command(fmt::format("SOURCE_DATE_EPOCH={} {} {}", kPinnedTime,
                                            testing::sluice_binary(),
                                            run_args(input, output, extra)));
  }

  TempDir work_;
  static TempDir* dir_;
};
TempDir* BatchJob::dir_ = nullptr;

TEST_F(BatchJob, StopStringMatcherFiresOnTheTokenThatCompletesTheString) {
  auto tok = Tokenizer::load(model_dir());
  const std::vector<int32_t> ids = tok->encode("the cat sat on the mat and more", false);
  StopStringMatcher matcher(*tok, {"on the m"});
  size_t fired = 0;
  for (size_t n = 1; n <= ids.size() && !fired; ++n)
    if (matcher.matches(std::span<const int>(ids.data(), n))) fired = n;
  ASSERT_GT(fired, 0u) << "the stop string was never found";
  const std::string before = tok->decode(std::span(ids.data(), fired - 1));
  const std::string at = tok->decode(std::span(ids.data(), fired));
  EXPECT_EQ(before.find("on the m"), std::string::npos) << before;
  EXPECT_NE(at.find("on the m"), std::string::npos) << at;

  bool found = false;
  EXPECT_EQ(cut_at_stop_string("abcXdefYg", {"Y", "X"}, &found), "abc");
  EXPECT_TRUE(found);
  EXPECT_EQ(cut_at_stop_string("abc", {"Y"}, &found), "abc");
  EXPECT_FALSE(found);
  EXPECT_FALSE(make_stop_check(*tok, {}));
}

TEST_F(BatchJob, ChatPromptHasTheTemplatesBosOnce) {
  auto tok = Tokenizer::load(model_dir());
  ChatPrompter prompter = ChatPrompter::load(model_dir(), *tok);
  EXPECT_EQ(prompter.render(single_user_message("Hi")), "<s>[INST] Hi [/INST]");
  std::vector<int> ids = prompter.encode(single_user_message("Hi"));
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], tok->bos_id());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->bos_id()), 1);
  std::vector<int32_t> plain = tok->encode("[INST] Hi [/INST]");  // BOS added by the tokenizer
  EXPECT_EQ(ids, std::vector<int>(plain.begin(), plain.end()));
}

TEST_F(BatchJob, ResultsFileCutsATornLineAndAppendsWholeLines) {
  const fs::path out = work_ / "out.jsonl";
  const std::string path = out.string();
  BatchResult r;
  r.custom_id = "a";
  r.finish_reason = "length";
  const std::string good = format_batch_result(r) + format_batch_error("b", "invalid_json", "m");
  const std::string fragment = R"({"id":"batch_req_1","custom_id":"c","respo)";
  write_file(out, good + fragment);
  {
    ResultsFile file(out);
    EXPECT_EQ(file.torn_bytes_removed(), fragment.size());
    EXPECT_EQ(file.recorded(), (std::unordered_map<std::string, bool>{{"a", false}, {"b", true}}));
    EXPECT_EQ(read_bytes(out), good);
    EXPECT_ERROR_MENTIONS(ResultsFile second(out), path.c_str(), "locked");
    file.append(format_batch_error("c", "x", "y"));
  }
  EXPECT_EQ(read_bytes(out), good + format_batch_error("c", "x", "y"));

  write_file(out, good + "not a result\n");
  const std::string third_line = path + ":3";
  EXPECT_ERROR_MENTIONS(ResultsFile bad(out), third_line.c_str(), "result line");
}

TEST_F(BatchJob, BothShapesAndBadLinesGiveOneResultPerCustomId) {
  const std::string long_prompt = Json(std::vector<int>(4096, 5)).dump();
  const std::string nearly_full = Json(std::vector<int>(4090, 5)).dump();
  const std::vector<std::string> lines = {
      R"({"custom_id": "flat-text", "prompt": "The cat", "max_tokens": 6, "temperature": 0})",
      R"({"custom_id": "flat-chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "logprobs": true})",
      R"({"custom_id": "batch-chat", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hey"}], "max_tokens": 4, "seed": 3, "logprobs": true}})",
      R"({"custom_id": "batch-text", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 40, 41], "max_tokens": 3, "top_k": 5}})",
      R"({"custom_id": "bad-json", "prompt": )",
      R"({"custom_id": "bad-type", "prompt": "x", "temperature": "warm"})",
      R"({"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}})",
      R"({"custom_id": "no-prompt", "max_tokens": 3})",
      R"({"custom_id": "template", "messages": [{"role": "user", "content": 5}]})",
      R"({"custom_id": "too-long", "prompt": )" + long_prompt + "}",
      R"({"custom_id": "no-room", "prompt": )" + nearly_full + R"(, "max_tokens": 10})",
      R"({"custom_id": "bad-id", "prompt": [1, 100000]})",
      R"({"custom_id": "zero", "prompt": "x", "max_tokens": 0})",
      R"({"custom_id": "flat-text", "prompt": "duplicate", "max_tokens": 2})",
      R"({"custom_id": 17, "prompt": "x"})",
      "",
      R"({"custom_id": "last", "prompt": "x", "max_tokens": 1, "user": "u"})",
  };
  std::string input;
  for (const auto& l : lines) input += l + "\n";
  write_file(work_ / "in.jsonl", input);
  CommandResult run = run_job(work_ / "in.jsonl", work_ / "out.jsonl");
  EXPECT_EQ(run.status, 2) << run.output;
  // Unknown fields are reported once per name, the duplicate once.
  EXPECT_NE(run.output.find("field 'logprobs' is not used"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("field 'logprobs'"), run.output.rfind("field 'logprobs'"));
  EXPECT_NE(run.output.find("field 'body.logprobs' is not used"), std::string::npos);
  EXPECT_NE(run.output.find("field 'user' is not used"), std::string::npos);
  EXPECT_NE(run.output.find("in.jsonl:14: custom_id \"flat-text\" already appeared on line 1"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("15 requests: 5 completed, 10 failed"), std::string::npos)
      << run.output;

  std::map<std::string, Json> results = results_by_id(work_ / "out.jsonl");
  const std::map<std::string, std::string> expected_errors = {
      {"line-5", "invalid_json"},
      {"bad-type", "invalid_request"},
      {"bad-url", "invalid_url"},
      {"no-prompt", "invalid_request"},
      {"template", "template_error"},
      {"too-long", "context_length_exceeded"},
      {"no-room", "context_length_exceeded"},
      {"bad-id", "invalid_request"},
      {"zero", "invalid_request"},
      {"line-15", "invalid_request"}};
  const std::map<std::string, std::pair<std::string, int>> expected_ok = {
      {"flat-text", {"text_completion", 6}},
      {"flat-chat", {"chat.completion", 5}},
      {"batch-chat", {"chat.completion", 4}},
      {"batch-text", {"text_completion", 3}},
      {"last", {"text_completion", 1}}};
  EXPECT_EQ(results.size(), expected_errors.size() + expected_ok.size());
  for (const auto& [id, code] : expected_errors) {
    ASSERT_TRUE(results.count(id)) << id;
    const Json& r = results[id];
    EXPECT_TRUE(r["response"].is_null()) << id;
    EXPECT_EQ(r["error"]["code"], code) << id << ": " << r.dump();
    EXPECT_TRUE(r["error"]["message"].is_string()) << id;
  }
  for (const auto& [id, shape] : expected_ok) {
    ASSERT_TRUE(results.count(id)) << id;
    const Json& r = results[id];
    EXPECT_TRUE(r["error"].is_null()) << id;
    EXPECT_EQ(r["id"], fmt::format("batch_req_{:016x}", custom_id_hash(id)));
    EXPECT_EQ(r["response"]["status_code"], 200);
    const Json& body = r["response"]["body"];
    EXPECT_EQ(body["object"], shape.first) << id;
    EXPECT_EQ(body["model"], "tiny");
    EXPECT_EQ(body["created"], std::stoll(kPinnedTime));
    const Json& usage = body["usage"];
    EXPECT_GE(usage["completion_tokens"].get<int>(), 1) << id;
    EXPECT_LE(usage["completion_tokens"].get<int>(), shape.second) << id;
    EXPECT_EQ(usage["total_tokens"].get<int>(),
              usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
    const std::string reason = body["choices"][0]["finish_reason"];
    if (usage["completion_tokens"] == shape.second)
      EXPECT_TRUE(reason == "length" || reason == "stop") << reason;
    else
      EXPECT_EQ(reason, "stop") << id;  // ended early: only EOS could end it
  }
  EXPECT_EQ(results["batch-text"]["response"]["body"]["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(results["flat-chat"]["response"]["body"]["choices"][0]["message"]["role"], "assistant");

  // A rerun finds every custom_id done: it writes nothing and still reports the failures.
  const std::string before = read_bytes(work_ / "out.jsonl");
  CommandResult again = run_job(work_ / "in.jsonl", work_ / "out.jsonl");
  EXPECT_EQ(again.status, 2) << again.output;
  EXPECT_EQ(read_bytes(work_ / "out.jsonl"), before);
  EXPECT_NE(again.output.find("15 skipped as already done (10 of them failed)"), std::string::npos)
      << again.output;
}

// Requests with sampling, with and without their own seeds.
std::string sampled_requests(int count, int max_tokens) {
  std::string input;
  for (int i = 0; i < count; ++i) {
    Json r = {{"custom_id", fmt::format("req-{}", i)},
              {"prompt", fmt::format("Story {} begins", i)},
              {"max_tokens", max_tokens},
              {"temperature", 0.9}};
    if (i % 2) r["seed"] = 1000 + i;
    input += r.dump() + "\n";
  }
  return input;
}

TEST_F(BatchJob, SameInputAndSeedsGiveTheSameBytes) {
  write_file(work_ / "in.jsonl", sampled_requests(12, 8));
  CommandResult first = run_job(work_ / "in.jsonl", work_ / "a.jsonl", "--progress-interval 0");
  CommandResult second = run_job(work_ / "in.jsonl", work_ / "b.jsonl");
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_EQ(second.status, 0) << second.output;
  // Not a terminal: plain progress lines (here after every step), then the summary.
  EXPECT_NE(first.output.find("/12 requests done"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("12 requests: 12 completed, 0 failed"), std::string::npos);
  EXPECT_EQ(results_by_id(work_ / "a.jsonl").size(), 12u);
  EXPECT_EQ(read_bytes(work_ / "a.jsonl"), read_bytes(work_ / "b.jsonl"));
  // Seeds matter: two requests with the same prompt and different seeds sample differently.
  write_file(
      work_ / "seeds.jsonl",
      R"({"custom_id": "s1", "prompt": "Same", "max_tokens": 12, "temperature": 1.5, "seed": 1})"
      "\n"
      R"({"custom_id": "s2", "prompt": "Same", "max_tokens": 12, "temperature": 1.5, "seed": 2})"
      "\n");
  ASSERT_EQ(run_job(work_ / "seeds.jsonl", work_ / "seeds-out.jsonl").status, 0);
  auto seeded = results_by_id(work_ / "seeds-out.jsonl");
  EXPECT_NE(completion_text(seeded["s1"]), completion_text(seeded["s2"]));
}

// With --batch 1 every request runs alone, so its tokens do not depend on which other requests
// share its steps: an interrupted-and-resumed job must then write exactly the bytes of an
// uninterrupted one.
TEST_F(BatchJob, ResumesAfterSigkillWithoutLosingOrRepeatingResults) {
  constexpr int kRequests = 100;
  write_file(work_ / "in.jsonl", sampled_requests(kRequests, 32));
  const std::string flags = "--batch 1";
  ASSERT_EQ(run_job(work_ / "in.jsonl", work_ / "full.jsonl", flags).status, 0);
  const std::string full = read_bytes(work_ / "full.jsonl");
  ASSERT_EQ(split_lines(full).size(), size_t(kRequests));

  const fs::path out = work_ / "out.jsonl";
  const std::string command = fmt::format("exec {} {} >/dev/null 2>&1", testing::sluice_binary(),
                                          run_args(work_ / "in.jsonl", out, flags));
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("SOURCE_DATE_EPOCH", kPinnedTime, 1);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Kill it once a few results are written, wherever it is.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (split_lines(read_bytes(out)).size() < 5 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the job ended before it was killed";
  const std::string killed = read_bytes(out);
  const std::string kept = killed.substr(0, killed.rfind('\n') + 1);
  const size_t kept_lines = split_lines(kept).size();
  ASSERT_GE(kept_lines, 5u);
  ASSERT_LT(kept_lines, size_t(kRequests)) << "the job finished before the kill; make it longer";

  CommandResult resumed = run_job(work_ / "in.jsonl", out, flags);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("{} already done", kept_lines)), std::string::npos)
      << resumed.output;
  const std::string after = read_bytes(out);
  EXPECT_EQ(after.substr(0, kept.size()), kept) << "results of the killed run were changed";
  std::map<std::string, Json> results = results_by_id(out);
  EXPECT_EQ(results.size(), size_t(kRequests));
  EXPECT_EQ(after, full);
}

TEST_F(BatchJob, TornLastLineIsCutAndItsRequestRunAgain) {
  write_file(work_ / "in.jsonl", sampled_requests(5, 6));
  ASSERT_EQ(run_job(work_ / "in.jsonl", work_ / "full.jsonl", "--batch 1").status, 0);
  const std::string full = read_bytes(work_ / "full.jsonl");
  const std::vector<std::string> lines = split_lines(full);
  ASSERT_EQ(lines.size(), 5u);
  // Two whole lines and half of the third, as a kill -9 inside write() would leave them.
  const std::string torn =
      lines[0] + "\n" + lines[1] + "\n" + lines[2].substr(0, lines[2].size() / 2);
  write_file(work_ / "out.jsonl", torn);
  CommandResult resumed = run_job(work_ / "in.jsonl", work_ / "out.jsonl", "--batch 1");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("removed a torn last line"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("2 already done"), std::string::npos) << resumed.output;
  EXPECT_EQ(read_bytes(work_ / "out.jsonl"), full);
}

// A KV cache the user made too small for one request fails that request alone.
TEST_F(BatchJob, RequestLargerThanTheGivenKvCacheFailsAlone) {
  write_file(work_ / "in.jsonl",
             R"({"custom_id": "short", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0})"
             "\n"
             R"({"custom_id": "long", "prompt": [5, 6, 7], "max_tokens": 40, "temperature": 0})"
             "\n");
  CommandResult r =
      run_job(work_ / "in.jsonl", work_ / "out.jsonl", "--kv-blocks 2 --kv-block-size 16");
  EXPECT_EQ(r.status, 2) << r.output;
  auto results = results_by_id(work_ / "out.jsonl");
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results["short"]["error"].is_null()) << results["short"].dump();
  EXPECT_EQ(results["long"]["error"]["code"], "kv_cache_too_small");
  EXPECT_EQ(results["long"]["error"]["message"],
            "3 prompt + 40 new tokens need 3 KV-cache blocks of 16 tokens; the largest KV pool "
            "has 2");
}

TEST_F(BatchJob, StopStringEndsTheTextBeforeIt) {
  // The greedy continuation without a stop string, then the same request stopped inside it.
  const std::string request =
      R"({"custom_id": "s", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0)";
  write_file(work_ / "free.jsonl", request + "}\n");
  ASSERT_EQ(run_job(work_ / "free.jsonl", work_ / "free-out.jsonl").status, 0);
  const Json free = results_by_id(work_ / "free-out.jsonl")["s"];
  const std::string text = completion_text(free);
  // A stop string of two ASCII characters from the middle of the text.
  size_t at = std::string::npos;
  for (size_t i = text.size() / 3; i + 1 < text.size() && at == std::string::npos; ++i)
    if (std::isalnum(static_cast<unsigned char>(text[i])) &&
        std::isalnum(static_cast<unsigned char>(text[i + 1])))
      at = i;
  ASSERT_NE(at, std::string::npos) << "no two ASCII letters in a row in: " << text;
  const std::string stop = text.substr(at, 2);
  write_file(work_ / "stop.jsonl",
             request + R"(, "stop": ["\u0001", )" + Json(stop).dump() + "]}\n");
  ASSERT_EQ(run_job(work_ / "stop.jsonl", work_ / "stop-out.jsonl").status, 0);
  const Json stopped = results_by_id(work_ / "stop-out.jsonl")["s"];
  EXPECT_EQ(completion_text(stopped), text.substr(0, text.find(stop)));
  EXPECT_EQ(stopped["response"]["body"]["choices"][0]["finish_reason"], "stop");
  EXPECT_LE(stopped["response"]["body"]["usage"]["completion_tokens"].get<int>(),
            free["response"]["body"]["usage"]["completion_tokens"].get<int>());
}

TEST_F(BatchJob, GenerateChatSendsOneUserMessageThroughTheTemplate) {
  write_file(
      work_ / "in.jsonl",
      R"({"custom_id": "c", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6, "temperature": 0})"
      "\n");
  ASSERT_EQ(run_job(work_ / "in.jsonl", work_ / "out.jsonl").status, 0);
  const std::string reply = completion_text(results_by_id(work_ / "out.jsonl")["c"]);
  CommandResult generate = testing::run_command(fmt::format(
      "({} generate --model {} --prompt 'Hello there' --chat --max-new-tokens 6 --threads 1 "
      "2>/dev/null)",
      testing::sluice_binary(), model_dir().string()));
  ASSERT_EQ(generate.status, 0) << generate.output;
  EXPECT_EQ(generate.output, reply + "\n");
}

TEST_F(BatchJob, ChatRequestsFailAloneWhenTheModelHasNoChatTemplate) {
  const fs::path model = work_ / "no-template";
  fs::create_directory(model);
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json"})
    fs::copy_file(model_dir() / name, model / name);
  write_file(
      work_ / "in.jsonl",
      R"({"custom_id": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})"
      "\n"
      R"({"custom_id": "text", "prompt": "Hi", "max_tokens": 2})"
      "\n");
  CommandResult run = testing::run_command(
      fmt::format("{} run --model {} --input {} --output {} --threads 1", testing::sluice_binary(),
                  model.string(), (work_ / "in.jsonl").string(), (work_ / "out.jsonl").string()));
  EXPECT_EQ(run.status, 2) << run.output;
  auto results = results_by_id(work_ / "out.jsonl");
  EXPECT_EQ(results["chat"]["error"]["code"], "template_error");
  EXPECT_NE(results["chat"]["error"]["message"].get<std::string>().find("no chat template"),
            std::string::npos)
      << results["chat"].dump();
  EXPECT_TRUE(results["text"]["error"].is_null()) << results["text"].dump();
}

TEST_F(BatchJob, FatalErrorsExitWithOneAndAClearMessage) {
  write_file(work_ / "in.jsonl", R"({"custom_id": "a", "prompt": "x", "max_tokens": 1})"
                                 "\n");
  write_file(work_ / "empty.jsonl", "\n  \n");
  fs::create_directory(work_ / "folder");
  const std::string bin = testing::sluice_binary();
  auto expect_fatal = [&](const std::string& args, const std::string& mention) {
    CommandResult r = testing::run_command(bin + " " + args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(mention), std::string::npos) << r.output;
  };
  const std::string model = model_dir().string();
  const std::string out = (work_ / "out.jsonl").string();
  expect_fatal(fmt::format("run --model {} --input {} --output {}", (work_ / "none").string(),
                           (work_ / "in.jsonl").string(), out),
               (work_ / "none").string());
  expect_fatal(fmt::format("run --model {} --input {} --output {}", model,
                           (work_ / "missing.jsonl").string(), out),
               "missing.jsonl: cannot open the input file");
  expect_fatal(
      fmt::format("run --model {} --input {} --output {}", model, (work_ / "folder").string(), out),
      "is a folder");
  expect_fatal(fmt::format("run --model {} --input {} --output {}", model,
                           (work_ / "empty.jsonl").string(), out),
               "empty.jsonl: no requests");
  expect_fatal(fmt::format("run --model {} --input {} --output {}", model,
                           (work_ / "in.jsonl").string(), (work_ / "no" / "out.jsonl").string()),
               "cannot open the output file");
  write_file(work_ / "notes.txt", "my notes\n");
  expect_fatal(fmt::format("run --model {} --input {} --output {}", model,
                           (work_ / "in.jsonl").string(), (work_ / "notes.txt").string()),
               "notes.txt:1: expected a result line");
  EXPECT_EQ(read_bytes(work_ / "notes.txt"), "my notes\n");  // left as it was
}

}  // namespace
}  // namespace sluice
