// Builds the syntax tree from tokens, following Jinja2's grammar and operator precedence
// (filters and tests bind tighter than arithmetic: `'a' + x | tojson` is `'a' + (x | tojson)`).
#pragma once

#include <string>

#include "io/jinja/ast.h"

namespace sluice::jinja {

// Throws TemplateError positioned at the offending token, saying what was expected.
Body parse_template(const std::string& source);

}  // namespace sluice::jinja
