// sluice chat-template: the prompt a model's chat template makes for a conversation, written to
// stdout byte for byte with nothing added, so it can be compared with what transformers renders.
// Only the tokenizer files are read.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "io/model_chat_template.h"

namespace {

struct ChatTemplateOptions {
  std::string model;
  std::string messages;
  std::string tools;
  std::string chat_template;
  bool no_generation_prompt = false;
};

// The JSON array in `path`; `what` names the option in errors.
nlohmann::ordered_json read_json_array(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) sluice::fail("{}: cannot open {} file", path, what);
  std::ostringstream text;
  text << in.rdbuf();
  auto json = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (json.is_discarded()) sluice::fail("{}: {}: not valid JSON", path, what);
  if (!json.is_array()) {
    sluice::fail("{}: {}: expected a JSON array, got {}", path, what, json.type_name());
  }
  return json;
}

int run(const ChatTemplateOptions& o) {
  const auto messages = read_json_array(o.messages, "--messages");
  const auto tools =
      o.tools.empty() ? nlohmann::ordered_json() : read_json_array(o.tools, "--tools");
  const auto chat_template = sluice::load_model_chat_template(o.model, o.chat_template);
  const std::string prompt =
      sluice::render_chat_prompt(chat_template, messages, tools, !o.no_generation_prompt);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return 0;
}

static sluice::cli::RegisterCommand reg({
    "chat-template",
    "Write the prompt a model's chat template makes for a conversation (stdout, nothing added)",
    [](CLI::App& sub) {
      auto o = std::make_shared<ChatTemplateOptions>();
      sub.add_option("--model", o->model,
                     "model folder, tokenizer_config.json or GGUF file (only tokenizer files are "
                     "read)")
          ->required();
      sub.add_option("--messages", o->messages, "JSON file: an array of {role, content, ...}")
          ->required();
      sub.add_option("--tools", o->tools, "JSON file: an array of tool schemas");
      sub.add_option("--chat-template", o->chat_template,
                     "a .jinja file to use instead of the model's template (its special tokens "
                     "are kept)");
      sub.add_flag("--no-generation-prompt", o->no_generation_prompt,
                   "render without add_generation_prompt");
      return std::function<int()>([o] { return run(*o); });
    },
});

}  // namespace
