#include "io/chat_prompt.h"

#include "core/error.h"
#include "io/gguf.h"

namespace sluice {

ChatPrompter::ChatPrompter(ChatTemplate chat_template, const Tokenizer& tokenizer,
                           nlohmann::ordered_json extra_context)
    : template_(std::move(chat_template)),
      tokenizer_(&tokenizer),
      extra_context_(std::move(extra_context)) {}

ChatPrompter ChatPrompter::load(const std::filesystem::path& model_dir,
                                const Tokenizer& tokenizer) {
  // A GGUF file carries its own template (tokenizer.chat_template), whatever lies beside it.
  const bool gguf = is_gguf_file(model_dir);
  const auto config = std::filesystem::is_directory(model_dir)
                          ? model_dir / "tokenizer_config.json"
                          : model_dir.parent_path() / "tokenizer_config.json";
  if (!gguf && std::filesystem::exists(config)) {
    return ChatPrompter(ChatTemplate::from_tokenizer_config(config), tokenizer,
                        nlohmann::ordered_json::object());
  }
  if (tokenizer.chat_template().empty())
    fail(
        "{}: no chat template (expected tokenizer_config.json with a 'chat_template' field, or a "
        "tokenizer file that carries one)",
        model_dir.string());
  // A template from GGUF metadata: its special-token strings come from the vocabulary.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (tokenizer.bos_id() >= 0) extra["bos_token"] = tokenizer.token_text(tokenizer.bos_id());
  if (tokenizer.eos_id() >= 0) extra["eos_token"] = tokenizer.token_text(tokenizer.eos_id());
  return ChatPrompter(
      ChatTemplate::parse(tokenizer.chat_template(), model_dir.string() + ": chat template"),
      tokenizer, std::move(extra));
}

std::string ChatPrompter::render(const nlohmann::ordered_json& messages) const {
  return template_.render(messages, /*add_generation_prompt=*/true, extra_context_);
}

std::vector<int> ChatPrompter::encode(const nlohmann::ordered_json& messages) const {
  std::vector<int32_t> ids = tokenizer_->encode(render(messages), /*add_special_tokens=*/false);
  return std::vector<int>(ids.begin(), ids.end());
}

nlohmann::ordered_json single_user_message(const std::string& text) {
  return nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}});
}

}  // namespace sluice
