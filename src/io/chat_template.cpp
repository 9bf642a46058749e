#include "io/chat_template.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "io/jinja/ast.h"
#include "io/jinja/evaluator.h"
#include "io/jinja/parser.h"

namespace sluice {
namespace {

[[noreturn]] void fail_at(const std::string& origin, const jinja::TemplateError& e) {
  if (e.pos().line > 0) fail("{}:{}:{}: {}", origin, e.pos().line, e.pos().column, e.what());
  fail("{}: {}", origin, e.what());
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open file", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A special token in tokenizer_config.json: a string, or an AddedToken object with its text in
// 'content'.
std::string token_text(const nlohmann::ordered_json& token, const std::string& file,
                       const std::string& field) {
  if (token.is_string()) return token.get<std::string>();
  if (token.is_object() && token.contains("content") && token["content"].is_string()) {
    return token["content"].get<std::string>();
  }
  fail("{}: field '{}': expected a string or an object with a 'content' string", file, field);
}

}  // namespace

ChatTemplate ChatTemplate::parse(std::string source, std::string origin) {
  ChatTemplate t;
  try {
    t.body_ = std::make_shared<const jinja::Body>(jinja::parse_template(source));
  } catch (const jinja::TemplateError& e) {
    fail_at(origin, e);
  }
  t.source_ = std::move(source);
  t.origin_ = std::move(origin);
  return t;
}

ChatTemplate ChatTemplate::from_jinja_file(const std::filesystem::path& path) {
  return parse(read_text(path), path.string());
}

ChatTemplate ChatTemplate::from_tokenizer_config(const std::filesystem::path& path) {
  const std::string file = path.string();
  auto config = nlohmann::ordered_json::parse(read_text(path), nullptr, false);
  if (config.is_discarded() || !config.is_object()) fail("{}: expected a JSON object", file);

  std::string source, origin = file + ": field 'chat_template'";
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    auto sibling = path.parent_path() / "chat_template.jinja";
    if (!std::filesystem::exists(sibling)) {
      fail(
          "{}: field 'chat_template': expected a string or a list of {{name, template}}, got "
          "nothing (and no chat_template.jinja next to it)",
          file);
    }
    source = read_text(sibling);
    origin = sibling.string();
  } else if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    std::string names;
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
          !entry.contains("template") || !entry["template"].is_string()) {
        fail(
            "{}: field 'chat_template': expected list entries {{\"name\": str, \"template\": str}}",
            file);
      }
      std::string name = entry["name"].get<std::string>();
      names += (names.empty() ? "" : ", ") + name;
      if (name == "default") source = entry["template"].get<std::string>();
    }
    if (source.empty()) {
      fail("{}: field 'chat_template': expected an entry named 'default', found: {}", file, names);
    }
    origin = file + ": field 'chat_template' (default)";
  } else {
    fail("{}: field 'chat_template': expected a string or a list, got {}", file, it->type_name());
  }

  ChatTemplate t = parse(std::move(source), std::move(origin));
  // transformers passes the tokenizer's special_tokens_map: the named tokens that are set, and
  // the list of additional special tokens.
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                           "cls_token", "mask_token"}) {
    auto token = config.find(name);
    if (token == config.end() || token->is_null()) continue;
    t.special_tokens_[name] = token_text(*token, file, name);
  }
  auto extra = config.find("additional_special_tokens");
  if (extra != config.end() && !extra->is_null()) {
    if (!extra->is_array()) {
      fail("{}: field 'additional_special_tokens': expected a list, got {}", file,
           extra->type_name());
    }
    auto& list = t.special_tokens_["additional_special_tokens"] = nlohmann::ordered_json::array();
    for (const auto& token : *extra) {
      list.push_back(token_text(token, file, "additional_special_tokens"));
    }
  }
  return t;
}

void ChatTemplate::set_special_tokens(nlohmann::ordered_json tokens) {
  if (!tokens.is_object()) fail("{}: special tokens: expected a JSON object", origin_);
  special_tokens_ = std::move(tokens);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra_context) const {
  if (!body_) fail("chat template: render() called on a template that was never parsed");
  if (!messages.is_array()) {
    fail("{}: messages: expected a JSON array of messages, got {}", origin_, messages.type_name());
  }
  if (!extra_context.is_null() && !extra_context.is_object()) {
    fail("{}: extra_context: expected a JSON object, got {}", origin_, extra_context.type_name());
  }
  // What transformers passes: special tokens, then messages/tools/documents/add_generation_prompt,
  // then the caller's keyword arguments.
  std::unordered_map<std::string, jinja::Value> context;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) {
    context[it.key()] = jinja::Value::from_json(it.value());
  }
  context["messages"] = jinja::Value::from_json(messages);
  context["tools"] = jinja::Value::none();
  context["documents"] = jinja::Value::none();
  context["add_generation_prompt"] = jinja::Value(add_generation_prompt);
  if (extra_context.is_object()) {
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) {
      context[it.key()] = jinja::Value::from_json(it.value());
    }
  }
  try {
    return jinja::render(*body_, context);
  } catch (const jinja::TemplateError& e) {
    fail_at(origin_, e);
  }
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra_context) const {
  return render(nlohmann::ordered_json(messages), add_generation_prompt,
                nlohmann::ordered_json(extra_context));
}

}  // namespace sluice
