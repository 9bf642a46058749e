#include "io/jinja/evaluator.h"

#include <memory>
#include <unordered_set>

#include "io/jinja/builtins.h"

namespace sluice::jinja {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

struct Frame {
  std::unordered_map<std::string, Value> vars;
  const Frame* parent = nullptr;
};

class Evaluator {
 public:
  Evaluator(const std::unordered_map<std::string, Value>& context, const RenderLimits& limits)
      : globals_(make_globals()), limits_(limits) {
    root_.vars = context;
  }

  std::string run(const Body& body) {
    std::string out;
    if (exec(body, root_, out) != Flow::kNormal) raise("'break' or 'continue' outside a loop");
    return out;
  }

 private:
  // ---- statements ----

  Flow exec(const Body& body, Frame& frame, std::string& out) {
    for (const auto& stmt : body) {
      Flow flow;
      try {
        flow = exec(*stmt, frame, out);
      } catch (TemplateError& e) {
        e.locate(stmt->pos);
        throw;
      }
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  void append(std::string& out, const std::string& text) {
    if (out.size() + text.size() > limits_.max_output_bytes) {
      raise("output larger than {} bytes", limits_.max_output_bytes);
    }
    out += text;
  }

  Flow exec(const Stmt& s, Frame& frame, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        append(out, s.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        append(out, eval(*s.expr, frame).str());
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (eval(*s.conditions[i], frame).truthy()) return exec(s.bodies[i], frame, out);
        }
        if (s.bodies.size() > s.conditions.size()) return exec(s.bodies.back(), frame, out);
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        exec_for(s, frame, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        exec_set(s, frame, eval(*s.expr, frame));
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        exec(s.bodies[0], frame, captured);
        frame.vars[s.targets[0]] = Value(std::move(captured));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        frame.vars[s.text] = make_macro(s);
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kScope:
        return exec(s.bodies[0], frame, out);
    }
    return Flow::kNormal;
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& value, Frame& frame) {
    if (targets.size() == 1) {
      frame.vars[targets[0]] = value;
      return;
    }
    List items = iterate(value);
    if (items.size() != targets.size()) {
      raise("cannot unpack {} value(s) into {} names", items.size(), targets.size());
    }
    for (size_t i = 0; i < targets.size(); ++i) frame.vars[targets[i]] = items[i];
  }

  void exec_set(const Stmt& s, Frame& frame, const Value& value) {
    if (s.text.empty()) {
      bind_targets(s.targets, value, frame);
      return;
    }
    Value target = lookup(s.targets[0], frame);
    if (!target.is_namespace()) {
      raise("cannot assign attribute '{}' on '{}': only namespace() objects can be modified",
            s.text, s.targets[0]);
    }
    // Namespaces are the only values a template can change, and they are held by reference
    // count: one that came to hold itself, directly or through lists, dicts and other
    // namespaces, would never be freed (Python's collector frees such cycles; we refuse them).
    std::unordered_set<const void*> seen;
    if (reaches(value, &target.as_namespace(), seen)) {
      raise(
          "cannot assign attribute '{}' on '{}': the value holds '{}' itself, and a namespace "
          "cannot contain itself",
          s.text, s.targets[0], s.targets[0]);
    }
    target.as_namespace().attrs.set(s.text, value);
  }

  // Whether `ns` is `v` or lies inside it; `seen` keeps shared parts from being walked twice.
  static bool reaches(const Value& v, const Namespace* ns, std::unordered_set<const void*>& seen) {
    auto walk = [&](const void* at, const auto& items, auto value_of) {
      if (!seen.insert(at).second) return false;
      for (const auto& item : items)
        if (reaches(value_of(item), ns, seen)) return true;
      return false;
    };
    const auto entry_value = [](const auto& entry) -> const Value& { return entry.second; };
    if (v.is_namespace()) {
      const Namespace& inner = v.as_namespace();
      if (&inner == ns) return true;
      return walk(&inner, inner.attrs.items, entry_value);
    }
    if (v.is_dict()) return walk(&v.as_dict(), v.as_dict().items, entry_value);
    if (v.is_list())
      return walk(&v.as_list(), v.as_list(),
                  [](const Value& item) -> const Value& { return item; });
    return false;
  }

  void exec_for(const Stmt& s, Frame& frame, std::string& out) {
    List items = iterate(eval(*s.expr, frame));
    if (s.condition) {  // `for x in xs if cond`: filtered before the loop, so loop.* counts kept
                        // items
      List kept;
      for (Value& item : items) {
        Frame probe{{}, &frame};
        bind_targets(s.targets, item, probe);
        if (eval(*s.condition, probe).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      count_step(s.pos);
      Frame body_frame{{}, &frame};
      bind_targets(s.targets, items[size_t(i)], body_frame);
      Dict loop;
      loop.items = {{"index", Value(i + 1)},      {"index0", Value(i)},
                    {"revindex", Value(n - i)},   {"revindex0", Value(n - i - 1)},
                    {"first", Value(i == 0)},     {"last", Value(i == n - 1)},
                    {"length", Value(n)},         {"depth", Value(int64_t(1))},
                    {"depth0", Value(int64_t(0))}};
      if (i > 0) loop.items.emplace_back("previtem", items[size_t(i - 1)]);
      if (i + 1 < n) loop.items.emplace_back("nextitem", items[size_t(i + 1)]);
      body_frame.vars["loop"] = Value(std::move(loop));
      if (exec(s.bodies[0], body_frame, out) == Flow::kBreak) break;
    }
    if (n == 0 && s.bodies.size() > 1) {
      Frame else_frame{{}, &frame};
      exec(s.bodies[1], else_frame, out);
    }
  }

  Value make_macro(const Stmt& s) {
    const Stmt* macro = &s;
    return Value(std::make_shared<const Function>(
        [this, macro](CallArgs& args) { return call_macro(*macro, args); }));
  }

  Value call_macro(const Stmt& macro, CallArgs& args) {
    if (++call_depth_ > limits_.max_call_depth) {
      --call_depth_;
      raise("macro calls nested deeper than {}", limits_.max_call_depth);
    }
    struct DepthRestore {
      int& depth;
      ~DepthRestore() { --depth; }
    } restore{call_depth_};
    if (args.positional.size() > macro.targets.size()) {
      raise("macro '{}' takes {} argument(s), got {}", macro.text, macro.targets.size(),
            args.positional.size());
    }
    Frame frame{{}, &root_};
    for (size_t i = 0; i < macro.targets.size(); ++i) {
      Value v = args.get(i, macro.targets[i].c_str());
      if (v.is_undefined() && macro.defaults[i]) v = eval(*macro.defaults[i], frame);
      if (v.is_undefined())
        v = Value::undefined(fmt::format("'{}' is undefined", macro.targets[i]));
      frame.vars[macro.targets[i]] = v;
    }
    for (const auto& [name, v] : args.keyword) {
      if (std::find(macro.targets.begin(), macro.targets.end(), name) == macro.targets.end()) {
        raise("macro '{}' has no parameter named '{}'", macro.text, name);
      }
    }
    std::string out;
    exec(macro.bodies[0], frame, out);
    return Value(std::move(out));
  }

  // ---- expressions ----

  Value lookup(const std::string& name, const Frame& frame) const {
    for (const Frame* f = &frame; f; f = f->parent) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return it->second;
    }
    auto it = globals_.find(name);
    if (it != globals_.end()) return it->second;
    return Value::undefined(fmt::format("'{}' is undefined", name));
  }

  void count_step(SourcePos pos) {
    if (++steps_ > limits_.max_steps) {
      throw TemplateError(fmt::format("template evaluation exceeded {} steps", limits_.max_steps),
                          pos);
    }
  }

  Value eval(const Expr& e, const Frame& frame) {
    count_step(e.pos);
    try {
      return eval_inner(e, frame);
    } catch (TemplateError& err) {
      err.locate(e.pos);
      throw;
    }
  }

  Value eval_optional(const ExprPtr& e, const Frame& frame) {
    return e ? eval(*e, frame) : Value::none();
  }

  CallArgs eval_args(const Expr& e, const Frame& frame, size_t first_arg) {
    CallArgs args;
    size_t n_keyword = e.kwarg_names.size();
    size_t n_positional = e.children.size() - first_arg - n_keyword;
    for (size_t i = 0; i < n_positional; ++i) {
      args.positional.push_back(eval(*e.children[first_arg + i], frame));
    }
    for (size_t i = 0; i < n_keyword; ++i) {
      args.keyword.emplace_back(e.kwarg_names[i],
                                eval(*e.children[first_arg + n_positional + i], frame));
    }
    return args;
  }

  Value eval_inner(const Expr& e, const Frame& frame) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return lookup(e.name, frame);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const auto& c : e.children) items.push_back(eval(*c, frame));
        return Value(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          Value key = eval(*e.children[i], frame);
          if (!key.is_string()) raise("dict keys must be strings here, got {}", key.type_name());
          dict.set(key.as_string(), eval(*e.children[i + 1], frame));
        }
        return Value(std::move(dict));
      }
      case Expr::Kind::kAttr:
        return get_attribute(eval(*e.children[0], frame), e.name);
      case Expr::Kind::kIndex:
        return get_item(eval(*e.children[0], frame), eval(*e.children[1], frame));
      case Expr::Kind::kSlice:
        return slice(eval(*e.children[0], frame), eval_optional(e.children[1], frame),
                     eval_optional(e.children[2], frame), eval_optional(e.children[3], frame));
      case Expr::Kind::kCall: {
        Value callee = eval(*e.children[0], frame);
        CallArgs args = eval_args(e, frame, 1);
        if (callee.is_undefined()) fail_undefined(callee);
        if (!callee.is_callable()) raise("'{}' object is not callable", callee.type_name());
        if (e.children[0]->kind == Expr::Kind::kName) args.callee = e.children[0]->name;
        return callee.as_callable()(args);
      }
      case Expr::Kind::kFilter: {
        Value input = eval(*e.children[0], frame);
        CallArgs args = eval_args(e, frame, 1);
        return apply_filter(e.name, input, args);
      }
      case Expr::Kind::kTest: {
        Value input = eval(*e.children[0], frame);
        CallArgs args = eval_args(e, frame, 1);
        return Value(apply_test(e.name, input, args) != e.negated);
      }
      case Expr::Kind::kUnary: {
        Value v = eval(*e.children[0], frame);
        if (e.name == "not") return Value(!v.truthy());
        if (e.name == "-") return negate(v);
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number()) raise("bad operand type for unary +: '{}'", v.type_name());
        return v.is_bool() ? Value(v.as_int()) : v;
      }
      case Expr::Kind::kBinary: {
        Value left = eval(*e.children[0], frame);
        // Python's and/or return an operand, not a bool: `x or ''` is x when x is truthy.
        if (e.name == "and") return left.truthy() ? eval(*e.children[1], frame) : left;
        if (e.name == "or") return left.truthy() ? left : eval(*e.children[1], frame);
        return binary_op(e.name, left, eval(*e.children[1], frame));
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.children[0], frame);
        for (size_t i = 0; i < e.kwarg_names.size(); ++i) {
          Value right = eval(*e.children[i + 1], frame);
          if (!compare_op(e.kwarg_names[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kConcat: {
        std::string out;
        for (const auto& c : e.children) {
          out += eval(*c, frame).str();
          if (out.size() > kMaxValueBytes) raise("value larger than {} bytes", kMaxValueBytes);
        }
        return Value(std::move(out));
      }
      case Expr::Kind::kCondExpr:
        if (eval(*e.children[0], frame).truthy()) return eval(*e.children[1], frame);
        if (e.children[2]) return eval(*e.children[2], frame);
        return Value::undefined("the inline if-expression was false and has no else branch");
    }
    raise("unhandled expression");
  }

  Frame root_;
  std::unordered_map<std::string, Value> globals_;
  RenderLimits limits_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

std::string render(const Body& body, const std::unordered_map<std::string, Value>& context,
                   const RenderLimits& limits) {
  return Evaluator(context, limits).run(body);
}

}  // namespace sluice::jinja
