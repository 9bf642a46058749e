// Python/Jinja semantics of operators, attribute and item access, iteration, filters, tests and
// the methods and globals chat templates call. Everything throws TemplateError (unpositioned; the
// evaluator adds the position) with Python's wording where that helps recognise the problem.
#pragma once

#include <string>
#include <unordered_map>

#include "io/jinja/value.h"

namespace sluice::jinja {

// Results larger than this are refused, so a template cannot exhaust memory by doubling a
// string in a loop.
constexpr size_t kMaxValueBytes = size_t(64) << 20;

[[noreturn]] void fail_undefined(const Value& v);

// operations.cpp
Value binary_op(const std::string& op, const Value& a, const Value& b);
bool compare_op(const std::string& op, const Value& a, const Value& b);
Value negate(const Value& v);
bool contains(const Value& container, const Value& item);
// Python iteration: list items, dict keys, string code points; Undefined iterates as empty.
List iterate(const Value& v);
Value get_item(const Value& obj, const Value& key);              // obj[key]
Value get_attribute(const Value& obj, const std::string& name);  // obj.name, methods bound
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Python str.strip/lstrip/rstrip; chars == nullptr strips whitespace.
std::string strip(const std::string& s, const std::string* chars, bool left, bool right);

// filters.cpp
Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
bool apply_test(const std::string& name, const Value& input, CallArgs& args);

// methods.cpp
// The bound method obj.name (str and dict methods), or Undefined when there is none.
Value bound_method(const Value& obj, const std::string& name);
// range, namespace, dict, raise_exception, strftime_now.
std::unordered_map<std::string, Value> make_globals();

}  // namespace sluice::jinja
