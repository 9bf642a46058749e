// Chat messages -> prompt token ids, as transformers' apply_chat_template(tokenize=True) builds
// them: the template is rendered with add_generation_prompt and the text is tokenized with
// add_special_tokens=False, because the template itself writes the BOS token (and any other
// special tokens) it wants. Adding the tokenizer's BOS on top would double it.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/chat_template.h"
#include "io/tokenizer.h"

namespace sluice {

class ChatPrompter {
 public:
  // The model's chat template (load_model_chat_template): tokenizer_config.json's
  // `chat_template` (or a sibling chat_template.jinja), or a GGUF file's. Fails when there is none.
  static ChatPrompter load(const std::filesystem::path& model_dir, const Tokenizer& tokenizer);

  std::string render(const nlohmann::ordered_json& messages) const;
  std::vector<int> encode(const nlohmann::ordered_json& messages) const;
  const ChatTemplate& chat_template() const { return template_; }

 private:
  ChatPrompter(ChatTemplate chat_template, const Tokenizer& tokenizer);

  ChatTemplate template_;
  const Tokenizer* tokenizer_;
};

// One user message holding `text`, the shape `generate --chat` sends.
nlohmann::ordered_json single_user_message(const std::string& text);

}  // namespace sluice
