// Renders a parsed template against a context of variables, with Jinja's scoping: a for loop's
// body (and a macro's) gets its own scope, so `set` inside it does not leak out, while `if` shares
// its enclosing scope; mutation across scopes goes through namespace() objects.
#pragma once

#include <string>
#include <unordered_map>

#include "io/jinja/ast.h"

namespace sluice::jinja {

struct RenderLimits {
  // Evaluated expressions and loop iterations per render. Real chat templates need a few per
  // message and loop; nested loops over large ranges stop here instead of running for hours.
  int64_t max_steps = 2'000'000;
  int max_call_depth = 64;  // macro recursion
  size_t max_output_bytes = size_t(64) << 20;
};

// Throws TemplateError positioned at the innermost failing construct.
std::string render(const Body& body, const std::unordered_map<std::string, Value>& context,
                   const RenderLimits& limits = {});

}  // namespace sluice::jinja
