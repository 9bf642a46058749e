// Tokenizer behaviour on small handwritten files and edge cases; the golden comparisons against
// the reference tokenizers are in tokenizer_golden_test.cpp.
#include "io/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/tokenizer/text_util.h"
#include "test_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kData = fs::path(SLUICE_SOURCE_DIR "/../shared/data/tokenizers");

// One folder per test process, removed when it exits.
const fs::path& temp_dir() {
  static const testing::TempDir dir;
  return dir.path();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

// A GPT-2 style byte-level BPE in the standard schema, as `sluice make-model` writes:
// <s> = 0, </s> = 1, the 256 byte characters = 2..257, then merged tokens.
json handwritten_byte_level() {
  json vocab = json::object();
  vocab["<s>"] = 0;
  vocab["</s>"] = 1;
  for (int b = 0; b < 256; ++b) vocab[tok::byte_to_unicode()[b]] = 2 + b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}};  // "Ġ w"
  json merge_list = json::array();
  int next = 258;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back(a + " " + b);
  }
  auto added = [](int id, const char* content) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  return {
      {"version", "1.0"},
      {"added_tokens", {added(0, "<s>"), added(1, "</s>")}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", merge_list},
        {"unk_token", nullptr},
        {"byte_fallback", false}}},
  };
}

int byte_id(unsigned char b) {
  return 2 + b;
}

class HandwrittenByteLevel : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = temp_dir() / "tokenizer.json";
    write(path_, handwritten_byte_level().dump());
    t_ = Tokenizer::load(path_);
  }
  fs::path path_;
  std::unique_ptr<Tokenizer> t_;
};

TEST_F(HandwrittenByteLevel, EncodesWithMergesAndBos) {
  // hello -> "hello" (261); " world" -> "Ġw" (262) o r l d
  const std::vector<int32_t> want = {
      0, 261, 262, byte_id('o'), byte_id('r'), byte_id('l'), byte_id('d')};
  EXPECT_EQ(t_->encode("hello world"), want);
  EXPECT_EQ(t_->encode("hello world", false), std::vector<int32_t>(want.begin() + 1, want.end()));
  EXPECT_EQ(t_->bos_id(), 0);
  EXPECT_EQ(t_->eos_id(), 1);
  EXPECT_EQ(t_->vocab_size(), 263);
  EXPECT_EQ(t_->token_text(261), "hello");
}

TEST_F(HandwrittenByteLevel, DecodesBackAndSkipsSpecials) {
  const auto ids = t_->encode("hello world</s>");
  EXPECT_EQ(ids.back(), 1);  // "</s>" in the text is the special token, not letters
  EXPECT_EQ(t_->decode(ids), "<s>hello world</s>");
  EXPECT_EQ(t_->decode(ids, /*skip_special_tokens=*/true), "hello world");
}

TEST_F(HandwrittenByteLevel, EmptyString) {
  EXPECT_EQ(t_->encode(""), std::vector<int32_t>{0});
  EXPECT_TRUE(t_->encode("", false).empty());
  EXPECT_EQ(t_->decode(std::vector<int32_t>{}), "");
}

TEST_F(HandwrittenByteLevel, InvalidUtf8BecomesReplacementCharacter) {
  // As the reference (which takes Unicode strings): a stray 0xFF is U+FFFD = EF BF BD.
  EXPECT_EQ(t_->encode("a\xFF", false),
            (std::vector<int32_t>{byte_id('a'), byte_id(0xEF), byte_id(0xBF), byte_id(0xBD)}));
}

TEST_F(HandwrittenByteLevel, DecodeSkipsIdsPastTheVocabulary) {
  // A model's padding rows (vocab_size > tokenizer size) decode to nothing, as in HF tokenizers.
  EXPECT_EQ(t_->decode(std::vector<int32_t>{byte_id('a'), 999, byte_id('b')}), "ab");
}

TEST_F(HandwrittenByteLevel, DecodeOfNegativeIdNamesTheFile) {
  try {
    t_->decode(std::vector<int32_t>{-999});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path_.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("999"), std::string::npos) << e.what();
  }
}

TEST_F(HandwrittenByteLevel, StreamingDecoderWaitsForCompleteCharacters) {
  // "é" is C3 A9: two byte tokens; the first alone must not produce text.
  StreamingDecoder s(*t_);
  EXPECT_EQ(s.push(261), "hello");
  EXPECT_EQ(s.push(byte_id(0xC3)), "");
  EXPECT_EQ(s.push(byte_id(0xA9)), "\xC3\xA9");
  EXPECT_EQ(s.push(262), " w");
  // An incomplete character left at the end becomes U+FFFD on flush.
  EXPECT_EQ(s.push(byte_id(0xE2)), "");
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD");
}

TEST_F(HandwrittenByteLevel, StreamingEqualsWholeDecodeOverLongText) {
  const std::string text =
      "hello w\xC3\xA9rld \xF0\x9F\xA6\x99 hello hello, \xE4\xBD\xA0\xE5\xA5\xBD!";
  const auto ids = t_->encode(text, false);
  StreamingDecoder s(*t_);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = s.push(id);
    EXPECT_TRUE(tok::is_valid_utf8(piece));
    streamed += piece;
  }
  streamed += s.flush();
  EXPECT_EQ(streamed, text);
}

// ---- errors name the file and the field

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerErrors, MissingPath) {
  const auto msg = error_of([] { Tokenizer::load("/nonexistent/tokenizer.json"); });
  EXPECT_NE(msg.find("/nonexistent/tokenizer.json"), std::string::npos) << msg;
}

TEST(TokenizerErrors, UnsupportedModelType) {
  json j = handwritten_byte_level();
  j["model"]["type"] = "WordPiece";
  const fs::path p = temp_dir() / "wordpiece.json";
  write(p, j.dump());
  const auto msg = error_of([&] { Tokenizer::load(p); });
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("WordPiece"), std::string::npos) << msg;
}

TEST(TokenizerErrors, UnsupportedPreTokenizerNamesTheField) {
  json j = handwritten_byte_level();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Digits"}}, {{"type", "UnicodeScripts"}}}}};
  const fs::path p = temp_dir() / "scripts.json";
  write(p, j.dump());
  const auto msg = error_of([&] { Tokenizer::load(p); });
  EXPECT_NE(msg.find("pre_tokenizer.pretokenizers[1].type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("UnicodeScripts"), std::string::npos) << msg;
}

TEST(TokenizerErrors, MergeWithUnknownToken) {
  json j = handwritten_byte_level();
  j["model"]["merges"].push_back("zz q");
  const fs::path p = temp_dir() / "badmerge.json";
  write(p, j.dump());
  const auto msg = error_of([&] { Tokenizer::load(p); });
  EXPECT_NE(msg.find("model.merges[5]"), std::string::npos) << msg;
}

// Numbers a fuzzer found or could find: a float far outside int's range where an id belongs
// (converting it was undefined behaviour), a negative id, an id that would size a 2^31 table, and
// a document whose shape the reader does not check field by field.
TEST(TokenizerErrors, IdsOutOfRangeNameTheField) {
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"float id", [](json& j) { j["model"]["vocab"]["h"] = 1e300; }, "model.vocab.h"},
      {"fractional id", [](json& j) { j["model"]["vocab"]["h"] = 2.5; }, "model.vocab.h"},
      {"negative id", [](json& j) { j["model"]["vocab"]["h"] = -3; }, "model.vocab.h"},
      {"huge id", [](json& j) { j["model"]["vocab"]["h"] = 2147483000; }, "model.vocab.h"},
      {"added id",
       [](json& j) {
         j["added_tokens"] = {{{"content", "<x>"}, {"id", -1}}};
       },
       "added_tokens[].id"},
      {"huge added id",
       [](json& j) {
         j["added_tokens"] = {{{"content", "<x>"}, {"id", 2147483000}}};
       },
       "added token '<x>'"},
      {"strip count",
       [](json& j) {
         j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 1e300}, {"stop", 0}};
       },
       "decoder.start"},
      {"post-processor id",
       [](json& j) {
         j["post_processor"] = {
             {"type", "BertProcessing"}, {"cls", {"[CLS]", -7}}, {"sep", {"[SEP]", 1}}};
       },
       "post_processor.cls[1]"},
      {"missing cls",
       [](json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       "unexpected structure"},
  };
  for (const Case& c : cases) {
    json j = handwritten_byte_level();
    c.edit(j);
    const fs::path p = temp_dir() / "bad_id.json";
    write(p, j.dump());
    const auto msg = error_of([&] { Tokenizer::load(p); });
    EXPECT_NE(msg.find(p.string()), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.field), std::string::npos) << c.name << ": " << msg;
  }
}

TEST(TokenizerErrors, TiktokenRankFarBeyondItsLinesIsRefused) {
  const fs::path p = temp_dir() / "cl100k_base.tiktoken";
  write(p, "IQ== 2000000000\n");
  const auto msg = error_of([&] { Tokenizer::load(p); });
  EXPECT_NE(msg.find("line 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("id 2000000000 is outside"), std::string::npos) << msg;
}

TEST(TokenizerErrors, NotJson) {
  const fs::path p = temp_dir() / "broken.json";
  write(p, "{\"model\": ");
  const auto msg = error_of([&] { Tokenizer::load(p); });
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
}

TEST(TokenizerErrors, TruncatedGguf) {
  const fs::path p = temp_dir() / "truncated.gguf";
  write(p, std::string("GGUF\x03\x00\x00\x00\x00\x00", 10));
  const auto msg = error_of([&] { Tokenizer::load(p); });
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("file ends early"), std::string::npos) << msg;
}

TEST(TokenizerErrors, UnknownTiktokenFile) {
  const fs::path p = temp_dir() / "mystery.tiktoken";
  write(p, "IQ== 0\n");
  const auto msg = error_of([&] { Tokenizer::load(p); });
  EXPECT_NE(msg.find("split pattern"), std::string::npos) << msg;
}

// ---- real files: special tokens inside text, streaming through byte fallback

#define REQUIRE_DATA()    \
  if (!fs::exists(kData)) \
  GTEST_SKIP() << "no shared tokenizer data at " << kData << " (the /work/shared folder is absent)"

TEST(TokenizerRealFiles, MixtralFolderUsesConfigAndSpecialTokens) {
  REQUIRE_DATA();
  // The folder holds tokenizer.json (preferred) and tokenizer_config.json (add_bos_token: true).
  const auto t = Tokenizer::load(kData / "mixtral");
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_FALSE(t->chat_template().empty());
  const auto ids = t->encode("Hi</s>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(t->decode(ids, true), "Hi");
}

TEST(TokenizerRealFiles, StreamingThroughByteFallback) {
  REQUIRE_DATA();
  const auto t = Tokenizer::load(kData / "mixtral/tokenizer.json");
  const std::string text = "Llamas \xF0\x9F\xA6\x99 and \xE1\x9E\x80\xE1\x9E\xB6 text";
  const auto ids = t->encode(text, false);
  StreamingDecoder s(*t);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = s.push(id);
    EXPECT_TRUE(tok::is_valid_utf8(piece)) << "token " << id;
    streamed += piece;
  }
  streamed += s.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(t->decode(ids), text);
}

TEST(TokenizerRealFiles, SentencePieceModelDecodes) {
  REQUIRE_DATA();
  const auto t = Tokenizer::load(kData / "mixtral/tokenizer.model");
  const std::string text = "Hello world \xF0\x9F\xA6\x99";
  const auto ids = t->encode(text);
  EXPECT_EQ(ids.front(), t->bos_id());
  EXPECT_EQ(t->decode(ids, true), text);
}

// ---- the CLI

std::string run_cli(const std::string& args) {
  const std::string cmd = testing::sluice_command("tokenize " + args + " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  pclose(p);
  return out;
}

TEST(TokenizeCommand, EncodesAndDecodesLines) {
  json j = handwritten_byte_level();
  const fs::path p = temp_dir() / "cli_tokenizer.json";
  write(p, j.dump());
  EXPECT_EQ(run_cli("--tokenizer " + p.string() + " --text 'hello world'"),
            "0 261 262 113 116 110 102\n");
  EXPECT_EQ(run_cli("--tokenizer " + p.string() + " --text 'hello world' --no-special"),
            "261 262 113 116 110 102\n");
  const fs::path in = temp_dir() / "lines.txt";
  write(in, "hello\n\nhello world\n");
  EXPECT_EQ(run_cli("--tokenizer " + p.string() + " --input " + in.string() + " --no-special"),
            "261\n\n261 262 113 116 110 102\n");
  write(in, "261 262 113 116 110 102\n0 261\n");
  EXPECT_EQ(run_cli("--tokenizer " + p.string() + " --input " + in.string() + " --decode"),
            "hello world\n<s>hello\n");
}

}  // namespace
}  // namespace sluice
