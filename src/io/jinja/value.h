// The values a chat template computes with. They mirror the Python objects Jinja2 sees when
// transformers renders a template (None, bool, int, float, str, list, dict, plus Jinja's own
// Undefined and namespace), because a template's output depends on Python's semantics: str(None)
// is "None", dicts keep insertion order, `[1] + [2]` concatenates, and so on.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace sluice::jinja {

class Value;
using List = std::vector<Value>;
struct Dict;
struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

// Jinja's Undefined: what a missing variable, key or attribute evaluates to. Printing it gives ""
// and testing it gives false, but using it in arithmetic or taking its attribute is an error;
// `what` says what was missing, for that error.
struct Undefined {
  std::string what;
};
struct None {};

// A namespace() object: the one mutable value, shared by reference, so `{% set ns.x = 1 %}` inside
// a loop is seen after the loop.
struct Namespace;

class Value {
 public:
  Value() : v_(Undefined{}) {}
  static Value undefined(std::string what) { return Value(Undefined{std::move(what)}); }
  static Value none() { return Value(None{}); }
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(List l) : v_(std::make_shared<const List>(std::move(l))) {}
  // What map/select/reject/selectattr/rejectattr return in Jinja2: a Python generator. It
  // iterates like a list, but is always true, has no len(), and json.dumps refuses it.
  static Value generator(List l) {
    Value v(std::move(l));
    v.generator_ = true;
    return v;
  }
  Value(Dict d);
  Value(std::shared_ptr<Namespace> ns) : v_(std::move(ns)) {}
  Value(std::shared_ptr<const Function> f) : v_(std::move(f)) {}

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python: bool is an int
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<const List>>(v_); }
  bool is_generator() const { return generator_; }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<const Dict>>(v_); }
  bool is_namespace() const { return std::holds_alternative<std::shared_ptr<Namespace>>(v_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<const Function>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return is_bool() ? int64_t(as_bool()) : std::get<int64_t>(v_); }
  double as_double() const { return is_float() ? std::get<double>(v_) : double(as_int()); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const List& as_list() const { return *std::get<std::shared_ptr<const List>>(v_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(v_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  const Function& as_callable() const { return *std::get<std::shared_ptr<const Function>>(v_); }
  const std::string& undefined_what() const { return std::get<Undefined>(v_).what; }

  // Python's type name, for error messages ("str", "int", "dict", ...).
  const char* type_name() const;
  // Python truthiness.
  bool truthy() const;
  // Python str(): what `{{ value }}` prints.
  std::string str() const;
  // Python repr(): how values appear inside a printed list or dict.
  std::string repr() const;

  static Value from_json(const nlohmann::ordered_json& j);
  static Value from_json(const nlohmann::json& j);

 private:
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(None n) : v_(n) {}

  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<const List>,
               std::shared_ptr<const Dict>, std::shared_ptr<Namespace>,
               std::shared_ptr<const Function>>
      v_;
  bool generator_ = false;
};

// A Python dict with string keys: insertion-ordered, small (chat messages have a handful of
// keys), so a vector with linear lookup.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;

  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

struct Namespace {
  Dict attrs;
};

// Arguments of a call: positional, then keyword, as written in the template.
struct CallArgs {
  List positional;
  std::vector<std::pair<std::string, Value>> keyword;
  std::string callee;  // for error messages

  // The argument at `index`, or the keyword `name`, or `fallback` when neither was given.
  Value get(size_t index, const char* name, Value fallback = Value()) const;
  // Fails when more positional arguments than `max_positional` were given.
  void expect_at_most(size_t max_positional) const;
};

// Python equality (1 == 1.0 == True, deep for lists and dicts, Undefined == Undefined).
bool equals(const Value& a, const Value& b);

// Python's float.__repr__: shortest round-trip digits, "1.0", "1e+16", "1.5e-05", "inf", "nan".
std::string python_float_repr(double d);

// Python's repr() of a str: single quotes unless the text holds ' and no ", escapes as Python.
std::string python_string_repr(const std::string& s);

// json.dumps as transformers' tojson filter calls it. indent: the text of one level (an int n
// is n spaces), none for no newlines; Python's default separators are (", ", ": "), or
// (",", ": ") when indenting. ensure_ascii escapes non-ASCII code points as \uXXXX.
struct JsonStyle {
  std::optional<std::string> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string to_json(const Value& value, const JsonStyle& style, const std::string& where);

}  // namespace sluice::jinja
