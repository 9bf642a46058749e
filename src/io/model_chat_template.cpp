#include "io/model_chat_template.h"

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_vocab.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

ChatTemplate from_gguf(const fs::path& path) {
  const GgufVocab vocab = read_gguf_vocab(path);
  if (vocab.chat_template.empty()) {
    fail("{}: key 'tokenizer.chat_template': missing; this GGUF file carries no chat template",
         path.string());
  }
  ChatTemplate t =
      ChatTemplate::parse(vocab.chat_template, path.string() + ": key 'tokenizer.chat_template'");
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  if (vocab.bos_id >= 0) tokens["bos_token"] = vocab.tokens[vocab.bos_id];
  if (vocab.eos_id >= 0) tokens["eos_token"] = vocab.tokens[vocab.eos_id];
  if (vocab.unk_id >= 0) tokens["unk_token"] = vocab.tokens[vocab.unk_id];
  t.set_special_tokens(std::move(tokens));
  return t;
}

ChatTemplate from_folder(const fs::path& dir) {
  if (fs::exists(dir / "tokenizer_config.json")) {
    return ChatTemplate::from_tokenizer_config(dir / "tokenizer_config.json");
  }
  if (fs::exists(dir / "chat_template.jinja")) {
    return ChatTemplate::from_jinja_file(dir / "chat_template.jinja");
  }
  fail(
      "{}: no chat template (expected tokenizer_config.json with a 'chat_template' field, or "
      "chat_template.jinja, or pass a GGUF file as the model)",
      dir.string());
}

ChatTemplate from_path(const fs::path& model) {
  if (fs::is_directory(model)) return from_folder(model);
  if (!fs::exists(model)) fail("{}: no such file or folder", model.string());
  if (is_gguf_file(model)) return from_gguf(model);
  if (model.extension() == ".json") return ChatTemplate::from_tokenizer_config(model);
  fail("{}: expected a model folder, a tokenizer_config.json or a GGUF file", model.string());
}

}  // namespace

ChatTemplate load_model_chat_template(const fs::path& model, const fs::path& template_file) {
  ChatTemplate t = from_path(model);
  if (template_file.empty()) return t;
  ChatTemplate replaced = ChatTemplate::from_jinja_file(template_file);
  replaced.set_special_tokens(t.special_tokens());
  return replaced;
}

std::string render_chat_prompt(const ChatTemplate& chat_template,
                               const nlohmann::ordered_json& messages,
                               const nlohmann::ordered_json& tools, bool add_generation_prompt) {
  if (!tools.is_null() && !tools.is_array()) {
    fail("{}: tools: expected a JSON array of tool schemas, got {}", chat_template.origin(),
         tools.type_name());
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  if (!tools.is_null()) context["tools"] = tools;
  return chat_template.render(messages, add_generation_prompt, context);
}

std::string render_chat_prompt(const fs::path& model, const nlohmann::ordered_json& messages,
                               const nlohmann::ordered_json& tools, bool add_generation_prompt) {
  return render_chat_prompt(load_model_chat_template(model), messages, tools,
                            add_generation_prompt);
}

}  // namespace sluice
