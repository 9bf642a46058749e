#include "io/chat_prompt.h"

#include "io/model_chat_template.h"

namespace sluice {

ChatPrompter::ChatPrompter(ChatTemplate chat_template, const Tokenizer& tokenizer)
    : template_(std::move(chat_template)), tokenizer_(&tokenizer) {}

ChatPrompter ChatPrompter::load(const std::filesystem::path& model_dir,
                                const Tokenizer& tokenizer) {
  return ChatPrompter(load_model_chat_template(model_dir), tokenizer);
}

std::string ChatPrompter::render(const nlohmann::ordered_json& messages) const {
  return render_chat_prompt(template_, messages, /*tools=*/nullptr,
                            /*add_generation_prompt=*/true);
}

std::vector<int> ChatPrompter::encode(const nlohmann::ordered_json& messages) const {
  std::vector<int32_t> ids = tokenizer_->encode(render(messages), /*add_special_tokens=*/false);
  return std::vector<int>(ids.begin(), ids.end());
}

nlohmann::ordered_json single_user_message(const std::string& text) {
  return nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}});
}

}  // namespace sluice
