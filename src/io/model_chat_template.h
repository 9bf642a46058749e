// A model's chat template, read from its tokenizer files only (no weights, no vocabulary beyond
// the special tokens): what `sluice chat-template`, the server's /apply-template and the chat
// prompts of `run` and `generate` render.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "io/chat_template.h"

namespace sluice {

// `model` is one of:
//  - a folder: its tokenizer_config.json (field 'chat_template', a string or a list of named
//    templates, or a sibling chat_template.jinja), else a chat_template.jinja alone;
//  - a tokenizer_config.json file (any name ending in .json);
//  - a GGUF file: its 'tokenizer.chat_template' metadata, bos/eos/unk tokens from its vocabulary.
// `template_file`, when given, replaces the template source and keeps the special tokens.
// Errors name the file and the field.
ChatTemplate load_model_chat_template(const std::filesystem::path& model,
                                      const std::filesystem::path& template_file = {});

// The prompt the template makes, as transformers' apply_chat_template(tokenize=False) renders it.
// messages: a JSON array of {role, content, ...}; tools: a JSON array of tool schemas, or null
// for none.
std::string render_chat_prompt(const ChatTemplate& chat_template,
                               const nlohmann::ordered_json& messages,
                               const nlohmann::ordered_json& tools, bool add_generation_prompt);
std::string render_chat_prompt(const std::filesystem::path& model,
                               const nlohmann::ordered_json& messages,
                               const nlohmann::ordered_json& tools, bool add_generation_prompt);

}  // namespace sluice
