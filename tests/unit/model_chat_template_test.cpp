// load_model_chat_template / render_chat_prompt: where a model's template is read from (folder,
// tokenizer_config.json, chat_template.jinja, GGUF metadata), a replacement template keeping the
// special tokens, tools, and errors that name the file and the field. Expected prompts are
// written out by hand from the small templates below.
#include "io/model_chat_template.h"

#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "model/gguf_export.h"
#include "test_util.h"

namespace sluice {
namespace {

using ojson = nlohmann::ordered_json;
using testing::TempDir;
using testing::write_file;

constexpr const char* kTemplate =
    "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    "{% if tools %}[{{ tools | length }} tools]{% endif %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}";

ojson conversation() {
  return ojson::array({{{"role", "user"}, {"content", "Hi é"}}});
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ModelChatTemplate, ReadsTheFolderConfigWithItsSpecialTokens) {
  TempDir dir;
  write_file(dir / "tokenizer_config.json",
             ojson{{"bos_token", {{"content", "<s>"}}}, {"chat_template", kTemplate}}.dump());
  EXPECT_EQ(render_chat_prompt(dir.path(), conversation(), nullptr, true),
            "<s><user>Hi é<assistant>");
  EXPECT_EQ(render_chat_prompt(dir.path(), conversation(), nullptr, false), "<s><user>Hi é");
  const ojson tools = ojson::array({{{"type", "function"}}, {{"type", "function"}}});
  EXPECT_EQ(render_chat_prompt(dir / "tokenizer_config.json", conversation(), tools, false),
            "<s><user>Hi é[2 tools]");
}

TEST(ModelChatTemplate, AReplacementTemplateKeepsTheSpecialTokens) {
  TempDir dir;
  write_file(dir / "tokenizer_config.json",
             ojson{{"bos_token", "<s>"}, {"chat_template", "unused"}}.dump());
  write_file(dir / "other.jinja", "{{ bos_token }}|{{ messages[0].content }}");
  EXPECT_EQ(render_chat_prompt(load_model_chat_template(dir.path(), dir / "other.jinja"),
                               conversation(), nullptr, true),
            "<s>|Hi é");
}

TEST(ModelChatTemplate, AFolderWithOnlyChatTemplateJinja) {
  TempDir dir;
  write_file(dir / "chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_EQ(render_chat_prompt(dir.path(), conversation(), nullptr, true), "Hi é");
}

TEST(ModelChatTemplate, ReadsGgufMetadataWithTokensFromTheVocabulary) {
  TempDir dir;
  GgufWriter gguf;
  gguf.add("tokenizer.ggml.model", GgufType::kString, "llama");
  gguf.add("tokenizer.ggml.tokens", GgufType::kArray, {"<unk>", "<s>", "</s>", "a"},
           GgufType::kString);
  gguf.add("tokenizer.ggml.bos_token_id", GgufType::kU32, 1);
  gguf.add("tokenizer.ggml.eos_token_id", GgufType::kU32, 2);
  gguf.add("tokenizer.chat_template", GgufType::kString,
           std::string(kTemplate) + "{{ eos_token }}");
  gguf.write(dir / "m.gguf");
  EXPECT_EQ(render_chat_prompt(dir / "m.gguf", conversation(), nullptr, true),
            "<s><user>Hi é<assistant></s>");

  gguf.remove("tokenizer.chat_template");
  gguf.write(dir / "none.gguf");
  EXPECT_NE(message_of([&] {
              load_model_chat_template(dir / "none.gguf");
            }).find("none.gguf: key 'tokenizer.chat_template': missing"),
            std::string::npos);
}

TEST(ModelChatTemplate, ErrorsNameTheFileAndTheField) {
  TempDir dir;
  EXPECT_NE(message_of([&] {
              load_model_chat_template(dir.path());
            }).find("no chat template (expected tokenizer_config.json"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              load_model_chat_template(dir / "missing");
            }).find("missing: no such file or folder"),
            std::string::npos);
  write_file(dir / "tokenizer_config.json", R"({"chat_template": 3})");
  EXPECT_NE(message_of([&] {
              load_model_chat_template(dir.path());
            }).find("tokenizer_config.json: field 'chat_template': expected a string or a list"),
            std::string::npos);
  write_file(dir / "tokenizer_config.json",
             R"({"chat_template": "x", "additional_special_tokens": "<a>"})");
  EXPECT_NE(message_of([&] {
              load_model_chat_template(dir.path());
            }).find("field 'additional_special_tokens': expected a list"),
            std::string::npos);
  write_file(dir / "tokenizer_config.json", R"({"chat_template": "{{ messages[0].content }}"})");
  EXPECT_NE(message_of([&] {
              render_chat_prompt(dir.path(), conversation(), ojson{{"a", 1}}, true);
            }).find("tools: expected a JSON array"),
            std::string::npos);
}

}  // namespace
}  // namespace sluice
