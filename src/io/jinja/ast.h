// The syntax tree of a parsed template. Expressions and statements are plain tagged structs:
// the evaluator switches on `kind`, which keeps every construct's semantics in one place.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/jinja/template_error.h"
#include "io/jinja/value.h"

namespace sluice::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // children = items
    kTuple,     // children = items (evaluates to a list)
    kDict,      // children = key0, value0, key1, value1, ...
    kAttr,      // children[0].name
    kIndex,     // children[0][children[1]]
    kSlice,     // children[0][children[1]:children[2]:children[3]], null = omitted
    kCall,      // children[0](children[1..]); the last kwarg_names.size() are keyword arguments
    kFilter,    // children[0] | name(children[1..])
    kTest,      // children[0] is [not] name(children[1..])
    kUnary,     // name in {"-", "+", "not"}
    kBinary,    // children[0] name children[1]; name is + - * / // % ** and or
    kCompare,   // children[0] op0 children[1] op1 children[2] ...; ops in kwarg_names
    kConcat,    // children joined with ~
    kCondExpr,  // children[1] if children[0] else children[2] (children[2] may be null)
  };
  Kind kind;
  SourcePos pos;
  std::string name;
  Value literal;
  std::vector<ExprPtr> children;
  std::vector<std::string> kwarg_names;
  bool negated = false;  // kTest: "is not"
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conditions[i] guards bodies[i]; an extra trailing body is the else branch
    kFor,       // for targets in expr [if condition]: bodies[0], else bodies[1] (may be absent)
    kSet,       // set targets = expr, or set targets[0].attr = expr (attr non-empty)
    kSetBlock,  // set targets[0] %} bodies[0] {% endset
    kMacro,     // macro name(params with defaults in `defaults`, null = required): bodies[0]
    kBreak,
    kContinue,
    kScope,  // bodies[0] rendered in place ({% generation %} from transformers)
  };
  Kind kind;
  SourcePos pos;
  std::string text;                 // kText; kMacro name; kSet attribute
  ExprPtr expr;                     // kOutput, kFor iterable, kSet value
  ExprPtr condition;                // kFor filter
  std::vector<ExprPtr> conditions;  // kIf
  std::vector<std::string> targets;
  std::vector<ExprPtr> defaults;  // kMacro
  std::vector<Body> bodies;
};

}  // namespace sluice::jinja
