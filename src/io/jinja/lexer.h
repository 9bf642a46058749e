// Splits a template into text and tag tokens, applying Jinja's whitespace control the way
// transformers configures it: `{%-`/`-%}` strip all neighbouring whitespace, trim_blocks drops the
// newline after a block or comment tag, lstrip_blocks drops the indentation before one, and
// `{%+`/`+%}` switch those two off for one tag. Comments vanish here; `{% raw %}` bodies become
// plain text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/jinja/template_error.h"

namespace sluice::jinja {

enum class TokenType {
  kText,        // template text outside tags
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // value holds the decoded text
  kInteger,
  kFloat,
  kOperator,  // + - * / // % ** ~ == != < > <= >= = ( ) [ ] { } , . : |
  kEnd,
};

struct Token {
  TokenType type;
  std::string value;
  SourcePos pos;
  int64_t int_value = 0;
  double float_value = 0.0;
};

// Throws TemplateError (with the position) on an unterminated tag, comment or string, or on a
// character that cannot start a token.
std::vector<Token> tokenize(const std::string& source);

const char* token_type_name(TokenType type);

}  // namespace sluice::jinja
