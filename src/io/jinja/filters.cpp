#include <algorithm>
#include <cerrno>
#include <cmath>
#include <string>
#include <unordered_map>

#include "io/jinja/builtins.h"
#include "io/jinja/template_error.h"
#include "io/jinja/utf8.h"

namespace sluice::jinja {
namespace {

int64_t length_of(const Value& v) {
  if (v.is_string()) return int64_t(utf8::length(v.as_string()));
  if (v.is_list() && !v.is_generator()) return int64_t(v.as_list().size());
  if (v.is_dict()) return int64_t(v.as_dict().items.size());
  if (v.is_undefined()) return 0;
  raise("object of type '{}' has no len()", v.type_name());
}

Value call_method(const Value& obj, const char* name, CallArgs args) {
  Value method = bound_method(obj, name);
  return method.as_callable()(args);
}

// The value of `attribute` in item, where "a.b" and "0" walk nested dicts and lists as Jinja's
// make_attrgetter does.
Value attribute_of(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return get_item(item, attribute);
  Value current = item;
  std::string path = attribute.str();
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    current = numeric ? get_item(current, Value(int64_t(std::stoll(part))))
                      : get_item(current, Value(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// select/reject/selectattr/rejectattr: keep items for which the test (truthiness when no test
// is named) equals `keep`.
Value select(const Value& input, CallArgs& args, bool by_attribute, bool keep) {
  size_t test_index = by_attribute ? 1 : 0;
  Value attribute = by_attribute ? args.get(0, "attribute") : Value();
  if (by_attribute && attribute.is_undefined()) raise("{}() needs an attribute name", args.callee);
  Value test = args.positional.size() > test_index ? args.positional[test_index] : Value();
  CallArgs test_args;
  test_args.callee = test.str();
  for (size_t i = test_index + 1; i < args.positional.size(); ++i) {
    test_args.positional.push_back(args.positional[i]);
  }
  List out;
  for (const Value& item : iterate(input)) {
    Value subject = by_attribute ? attribute_of(item, attribute) : item;
    bool passed =
        test.is_undefined() ? subject.truthy() : apply_test(test.str(), subject, test_args);
    if (passed == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

JsonStyle json_style(const CallArgs& args) {
  JsonStyle style;
  Value indent = args.get(1, "indent");
  if (indent.is_int()) {
    style.indent = std::string(size_t(std::clamp<int64_t>(indent.as_int(), 0, 64)), ' ');
  } else if (indent.is_string()) {
    style.indent = indent.as_string();
  } else if (!indent.is_undefined() && !indent.is_none()) {
    raise("tojson(): indent must be an integer, a string or None");
  }
  if (style.indent) style.item_separator.assign(1, ',');
  Value separators = args.get(2, "separators");
  if (separators.is_list()) {
    const List& seps = separators.as_list();
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      raise("tojson(): separators must be a pair of strings");
    }
    style.item_separator = seps[0].as_string();
    style.key_separator = seps[1].as_string();
  }
  style.ensure_ascii = args.get(0, "ensure_ascii", Value(false)).truthy();
  style.sort_keys = args.get(3, "sort_keys", Value(false)).truthy();
  return style;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Value to_int(const Value& v, const Value& fallback) {
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    double d = v.as_double();
    if (std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(int64_t(d));
    return fallback;
  }
  if (v.is_string()) {
    std::string s = strip(v.as_string(), nullptr, true, true);
    char* end = nullptr;
    errno = 0;
    long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0' && errno == 0) return Value(int64_t(i));
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18)
      return Value(int64_t(d));
  }
  return fallback;
}

Value to_float(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    std::string s = strip(v.as_string(), nullptr, true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value(d);
  }
  return fallback;
}

// The filters, each given the name it was called by (some answer to several).
using FilterFn = Value (*)(const std::string& name, const Value& input, CallArgs& args);

Value filter_length(const std::string&, const Value& input, CallArgs&) {
  return Value(length_of(input));
}

Value filter_escape(const std::string&, const Value& input, CallArgs&) {
  return Value(html_escape(input.str()));
}

Value filter_default(const std::string&, const Value& input, CallArgs& args) {
  Value fallback = args.get(0, "default_value", Value(""));
  bool boolean = args.get(1, "boolean", Value(false)).truthy();
  return input.is_undefined() || (boolean && !input.truthy()) ? fallback : input;
}

Value filter_tojson(const std::string&, const Value& input, CallArgs& args) {
  if (input.is_undefined()) fail_undefined(input);
  return Value(to_json(input, json_style(args), "tojson"));
}

// Not in transformers; llama.cpp's templates (DeepSeek-V3.2) use it.
Value filter_from_json(const std::string&, const Value& input, CallArgs&) {
  if (!input.is_string()) raise("from_json expects a string, got {}", input.type_name());
  auto parsed = nlohmann::ordered_json::parse(input.as_string(), nullptr, false);
  if (parsed.is_discarded()) raise("from_json: the string is not valid JSON");
  return Value::from_json(parsed);
}

Value filter_items(const std::string&, const Value& input, CallArgs&) {
  if (input.is_undefined()) return Value(List{});
  if (!input.is_dict()) raise("can only get item pairs from a mapping, got {}", input.type_name());
  return call_method(input, "items", CallArgs{});
}

Value filter_first_or_last(const std::string& name, const Value& input, CallArgs&) {
  List items = iterate(input);
  if (items.empty()) return Value::undefined(fmt::format("no {} item, sequence was empty", name));
  return name == "first" ? items.front() : items.back();
}

Value filter_reverse(const std::string&, const Value& input, CallArgs&) {
  List items = iterate(input);
  std::reverse(items.begin(), items.end());
  if (!input.is_string()) return Value(std::move(items));
  std::string out;
  for (const Value& c : items) out += c.as_string();
  return Value(out);
}

Value filter_join(const std::string&, const Value& input, CallArgs& args) {
  Value separator = args.get(0, "d", Value(""));
  Value attribute = args.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(input)) {
    if (!first) out += separator.str();
    out += (attribute.is_undefined() ? item : attribute_of(item, attribute)).str();
    first = false;
    if (out.size() > kMaxValueBytes) raise("value larger than {} bytes", kMaxValueBytes);
  }
  return Value(out);
}

Value filter_map(const std::string&, const Value& input, CallArgs& args) {
  Value attribute, fallback;
  for (const auto& [k, v] : args.keyword) {
    if (k == "attribute") attribute = v;
    if (k == "default") fallback = v;
  }
  List out;
  if (!attribute.is_undefined()) {
    for (const Value& item : iterate(input)) {
      Value v = attribute_of(item, attribute);
      out.push_back(v.is_undefined() && !fallback.is_undefined() ? fallback : v);
    }
    return Value::generator(std::move(out));
  }
  if (args.positional.empty()) raise("map() needs a filter name or attribute=");
  std::string filter = args.positional[0].str();
  for (const Value& item : iterate(input)) {
    CallArgs inner;
    inner.positional.assign(args.positional.begin() + 1, args.positional.end());
    out.push_back(apply_filter(filter, item, inner));
  }
  return Value::generator(std::move(out));
}

Value filter_select(const std::string& name, const Value& input, CallArgs& args) {
  return select(input, args, name.ends_with("attr"), name.starts_with("select"));
}

Value filter_trim(const std::string&, const Value& input, CallArgs& args) {
  Value chars = args.get(0, "chars");
  const std::string* set = chars.is_string() ? &chars.as_string() : nullptr;
  return Value(strip(input.str(), set, true, true));
}

// upper, lower, title, capitalize: the string method of the same name.
Value filter_case(const std::string& name, const Value& input, CallArgs&) {
  return call_method(Value(input.str()), name.c_str(), CallArgs{});
}

Value filter_replace(const std::string&, const Value& input, CallArgs& args) {
  CallArgs inner;
  inner.positional = {args.get(0, "old"), args.get(1, "new")};
  Value count = args.get(2, "count");
  if (!count.is_undefined()) inner.positional.push_back(count);
  return call_method(Value(input.str()), "replace", inner);
}

// Not a Jinja filter, but a common spelling in hand-written templates.
Value filter_split(const std::string&, const Value& input, CallArgs& args) {
  CallArgs inner;
  inner.positional = args.positional;
  return call_method(Value(input.str()), "split", inner);
}

Value filter_abs(const std::string&, const Value& input, CallArgs&) {
  if (input.is_float()) return Value(std::fabs(input.as_double()));
  if (input.is_int() || input.is_bool())
    return input.as_int() < 0 ? negate(input) : Value(input.as_int());
  raise("bad operand type for abs(): '{}'", input.type_name());
}

Value filter_unique(const std::string&, const Value& input, CallArgs&) {
  List out;
  for (const Value& item : iterate(input))
    if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equals(o, item); }))
      out.push_back(item);
  return Value::generator(std::move(out));
}

Value filter_sum(const std::string&, const Value& input, CallArgs& args) {
  Value total = args.get(1, "start", Value(int64_t(0)));
  Value attribute = args.get(0, "attribute");
  for (const Value& item : iterate(input))
    total = binary_op("+", total, attribute.is_undefined() ? item : attribute_of(item, attribute));
  return total;
}

Value filter_min_or_max(const std::string& name, const Value& input, CallArgs&) {
  List items = iterate(input);
  if (items.empty()) return Value::undefined(fmt::format("no {} item, sequence was empty", name));
  Value best = items[0];
  for (const Value& item : items)
    if (compare_op(name == "min" ? "<" : ">", item, best)) best = item;
  return best;
}

struct Filter {
  FilterFn fn;
  // Jinja's string filters (soft_str) and those that take any value see Undefined as it is;
  // the others refuse it.
  bool takes_undefined;
};

const std::unordered_map<std::string, Filter>& filters() {
  static const std::unordered_map<std::string, Filter> table = {
      {"default", {filter_default, true}},
      {"d", {filter_default, true}},
      {"length", {filter_length, true}},
      {"count", {filter_length, true}},
      {"safe", {[](const std::string&, const Value& v, CallArgs&) { return v; }, true}},
      {"string", {[](const std::string&, const Value& v, CallArgs&) { return Value(v.str()); },
                  true}},
      {"tojson", {filter_tojson, true}},
      {"from_json", {filter_from_json, true}},
      {"items", {filter_items, true}},
      {"list", {[](const std::string&, const Value& v, CallArgs&) { return Value(iterate(v)); },
                true}},
      {"first", {filter_first_or_last, true}},
      {"last", {filter_first_or_last, true}},
      {"reverse", {filter_reverse, true}},
      {"join", {filter_join, true}},
      {"map", {filter_map, true}},
      {"select", {filter_select, true}},
      {"reject", {filter_select, true}},
      {"selectattr", {filter_select, true}},
      {"rejectattr", {filter_select, true}},
      {"trim", {filter_trim, true}},
      {"upper", {filter_case, true}},
      {"lower", {filter_case, true}},
      {"title", {filter_case, true}},
      {"capitalize", {filter_case, true}},
      {"replace", {filter_replace, true}},
      {"split", {filter_split, true}},
      {"abs", {filter_abs, false}},
      {"int",
       {[](const std::string&, const Value& v, CallArgs& a) {
          return to_int(v, a.get(0, "default", Value(int64_t(0))));
        },
        false}},
      {"float",
       {[](const std::string&, const Value& v, CallArgs& a) {
          return to_float(v, a.get(0, "default", Value(0.0)));
        },
        false}},
      {"escape", {filter_escape, false}},
      {"e", {filter_escape, false}},
      {"forceescape", {filter_escape, false}},
      {"unique", {filter_unique, false}},
      {"sum", {filter_sum, false}},
      {"min", {filter_min_or_max, false}},
      {"max", {filter_min_or_max, false}},
  };
  return table;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  args.callee = name;
  const auto it = filters().find(name);
  if (it == filters().end()) raise("no filter named '{}'", name);
  if (!it->second.takes_undefined && input.is_undefined()) fail_undefined(input);
  return it->second.fn(name, input, args);
}

bool apply_test(const std::string& name, const Value& v, CallArgs& args) {
  args.callee = name;
  auto arg = [&] {
    if (args.positional.empty()) raise("test '{}' needs an argument", name);
    return args.positional[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  // Jinja's Undefined defines __iter__ and __len__, so it counts as iterable and as a sequence.
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence")
    return v.is_string() || (v.is_list() && !v.is_generator()) || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool())
      raise("test '{}' needs an integer, got {}", name, v.type_name());
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    Value d = arg();
    if (!d.is_int() || d.as_int() == 0 || !v.is_int()) raise("divisibleby needs non-zero integers");
    return v.as_int() % d.as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg());
  if (name == "ne" || name == "!=") return !equals(v, arg());
  if (name == "lt" || name == "lessthan" || name == "<") return compare_op("<", v, arg());
  if (name == "le" || name == "<=") return compare_op("<=", v, arg());
  if (name == "gt" || name == "greaterthan" || name == ">") return compare_op(">", v, arg());
  if (name == "ge" || name == ">=") return compare_op(">=", v, arg());
  if (name == "in") return contains(arg(), v);
  if (name == "sameas") {
    Value other = arg();
    if (v.is_namespace() && other.is_namespace()) return &v.as_namespace() == &other.as_namespace();
    // Python's `is` on None/True/False singletons; other identities are unknowable here.
    if (v.is_none() || v.is_bool())
      return equals(v, other) && std::string(v.type_name()) == other.type_name();
    return false;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    const std::string& s = v.as_string();
    bool cased = false;
    for (char c : s) {
      if (std::isalpha(uint8_t(c)) && uint8_t(c) < 0x80) {
        cased = true;
        if ((name == "lower") != (std::islower(uint8_t(c)) != 0)) return false;
      }
    }
    return cased;
  }
  if (name == "escaped") return false;
  raise("no test named '{}'", name);
}

}  // namespace sluice::jinja
