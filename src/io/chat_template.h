// Chat templates: renders a checkpoint's `chat_template` (Jinja2 source stored in
// tokenizer_config.json) for a list of chat messages, as transformers' apply_chat_template does:
// Jinja with trim_blocks and lstrip_blocks, the loopcontrols extension, transformers' tojson
// (no HTML escaping, keys in insertion order), raise_exception and strftime_now, and the context
// {messages, tools=None, documents=None, add_generation_prompt, bos_token, eos_token, ...}.
//
// The interpreter (src/io/jinja/) covers the Jinja subset real templates use. Not supported:
// include/import/extends/block, {% call %}, {% filter %}, {% with %}, recursive loops,
// loop.cycle, *args/**kwargs, '%' string formatting, tuples as a type (they behave as lists, so
// print as [..]), generators beyond what templates meet (map/select/reject/selectattr/rejectattr/
// unique results are always true, have no length, cannot be indexed, added or passed to tojson,
// as in Jinja2, but print as lists and can be iterated more than once), non-string dict keys, non-ASCII case mapping in upper/lower/title, unknown
// filters are reported when reached rather than at parse time, integers are 64-bit (overflow is
// an error). Added beyond transformers: the `from_json` filter (llama.cpp templates use it).
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace sluice {

namespace jinja {
struct Stmt;
}

class ChatTemplate {
 public:
  // Parses `source`; errors (sluice::Error) read "origin:line:col: expected X, got Y".
  static ChatTemplate parse(std::string source, std::string origin);
  // Parses a template file (chat_template.jinja); the file's path is the origin.
  static ChatTemplate from_jinja_file(const std::filesystem::path& path);

  // Reads `chat_template` from a tokenizer_config.json: a string, or a list of {name, template}
  // from which "default" is taken; when absent, a sibling chat_template.jinja (newer
  // transformers) is used. The special tokens (bos/eos/unk/sep/pad/cls/mask_token, plain or
  // AddedToken objects, and additional_special_tokens) become template variables.
  static ChatTemplate from_tokenizer_config(const std::filesystem::path& tokenizer_config_json);

  // messages: a JSON array of {"role", "content", ...}. extra_context: further variables (tools,
  // documents, enable_thinking, bos_token, ...), overriding the defaults. Use ordered_json when key
  // order matters: templates that print dicts (`tool | tojson`) print them in insertion order, as
  // Python does, and nlohmann::json has already sorted its keys.
  std::string render(
      const nlohmann::ordered_json& messages, bool add_generation_prompt,
      const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object()) const;
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra_context = nlohmann::json::object()) const;

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }
  // Special-token strings read from the tokenizer config (name -> text), given to the template.
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  // For templates that come without a tokenizer_config.json (GGUF metadata).
  void set_special_tokens(nlohmann::ordered_json tokens);

 private:
  std::string source_;
  std::string origin_;
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Stmt>>> body_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace sluice
