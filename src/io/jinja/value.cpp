#include "io/jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "io/jinja/template_error.h"
#include "io/jinja/utf8.h"

namespace sluice::jinja {

Value::Value(Dict d) : v_(std::make_shared<const Dict>(std::move(d))) {}

const char* Value::type_name() const {
  if (generator_) return "generator";
  switch (v_.index()) {
    case 0:
      return "Undefined";
    case 1:
      return "NoneType";
    case 2:
      return "bool";
    case 3:
      return "int";
    case 4:
      return "float";
    case 5:
      return "str";
    case 6:
      return "list";
    case 7:
      return "dict";
    case 8:
      return "Namespace";
    default:
      return "function";
  }
}

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_double() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_list()) return generator_ || !as_list().empty();
  if (is_dict()) return !as_dict().items.empty();
  return true;
}

std::string Value::str() const {
  if (is_undefined()) return "";
  if (is_string()) return as_string();
  return repr();
}

std::string Value::repr() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_float()) return python_float_repr(as_double());
  if (is_string()) return python_string_repr(as_string());
  if (is_list()) {
    std::string out = "[";
    const List& list = as_list();
    for (size_t i = 0; i < list.size(); ++i) out += (i ? ", " : "") + list[i].repr();
    return out + "]";
  }
  if (is_dict() || is_namespace()) {
    const Dict& dict = is_dict() ? as_dict() : as_namespace().attrs;
    std::string out = is_dict() ? "{" : "<Namespace {";
    for (size_t i = 0; i < dict.items.size(); ++i) {
      out += (i ? ", " : "") + python_string_repr(dict.items[i].first) + ": " +
             dict.items[i].second.repr();
    }
    return out + (is_dict() ? "}" : "}>");
  }
  return "<function>";
}

namespace {

template <typename Json>
Value value_from_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value(double(u));
      return Value(int64_t(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List list;
      list.reserve(j.size());
      for (const auto& item : j) list.push_back(value_from_json(item));
      return Value(std::move(list));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      for (auto it = j.begin(); it != j.end(); ++it) {
        dict.items.emplace_back(it.key(), value_from_json(it.value()));
      }
      return Value(std::move(dict));
    }
    default:
      return Value::none();  // binary and discarded values have no Python counterpart
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) {
  return value_from_json(j);
}
Value Value::from_json(const nlohmann::json& j) {
  return value_from_json(j);
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value CallArgs::get(size_t index, const char* name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return v;
  }
  return fallback;
}

void CallArgs::expect_at_most(size_t max_positional) const {
  if (positional.size() > max_positional) {
    raise("{}() takes at most {} positional argument(s), got {}", callee, max_positional,
          positional.size());
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_none() || b.is_none()) return a.is_none() && b.is_none();
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_list() && b.is_list() && !a.is_generator() && !b.is_generator()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!equals(x[i], y[i])) return false;
    }
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const Dict& x = a.as_dict();
    const Dict& y = b.as_dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* other = y.find(k);
      if (!other || !equals(v, *other)) return false;
    }
    return true;
  }
  if (a.is_namespace() && b.is_namespace()) return &a.as_namespace() == &b.as_namespace();
  return false;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits in the form "-d.ddde±XX"; Python then picks fixed or scientific
  // notation by the decimal exponent.
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out.append("0.").append(size_t(-exponent - 1), '0').append(digits);
    } else if (size_t(exponent) + 1 >= digits.size()) {
      out.append(digits).append(size_t(exponent) + 1 - digits.size(), '0').append(".0");
    } else {
      out.append(digits, 0, size_t(exponent) + 1).append(".").append(digits, size_t(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out.append(digits, 1);
  }
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

std::string python_string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t pos = 0, size = 1; pos < s.size(); pos += size) {
    uint32_t cp = utf8::decode(s, pos, &size);
    if (cp == uint32_t(quote) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) {
      out += fmt::format("\\x{:02x}", cp);
    } else if (cp == 0x2028 || cp == 0x2029) {
      out += fmt::format("\\u{:04x}", cp);
    } else {
      out.append(s, pos, size);
    }
  }
  return out + quote;
}

namespace {

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (uint8_t(c) < 0x20) {
          out += fmt::format("\\u{:04x}", int(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonStyle& style, int depth,
                const std::string& where) {
  if (depth > 200) raise("{}: value nested too deeply to serialize", where);
  auto newline = [&](int level) {
    if (!style.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *style.indent;
  };
  const std::string& item_sep = style.item_separator;
  const bool sort_keys = style.sort_keys;
  if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    double d = v.as_double();
    out += std::isnan(d)   ? "NaN"
           : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                           : python_float_repr(d);
  } else if (v.is_string()) {
    json_string(out, v.as_string());
  } else if (v.is_list() && !v.is_generator()) {
    const List& list = v.as_list();
    if (list.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < list.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      json_value(out, list[i], style, depth + 1, where);
    }
    newline(depth);
    out += ']';
  } else if (v.is_dict() || v.is_namespace()) {
    if (v.is_namespace()) raise("{}: Object of type Namespace is not JSON serializable", where);
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& item : v.as_dict().items) items.push_back(&item);
    if (items.empty()) {
      out += "{}";
      return;
    }
    if (sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](auto* a, auto* b) { return a->first < b->first; });
    }
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      json_string(out, items[i]->first);
      out += style.key_separator;
      json_value(out, items[i]->second, style, depth + 1, where);
    }
    newline(depth);
    out += '}';
  } else {
    raise("{}: Object of type {} is not JSON serializable", where, v.type_name());
  }
}

}  // namespace

std::string to_json(const Value& value, const JsonStyle& style, const std::string& where) {
  std::string out;
  json_value(out, value, style, 0, where);
  if (!style.ensure_ascii) return out;
  // Non-ASCII text only occurs inside string literals, so escaping every such code point of the
  // output is what json.dumps does for each string.
  std::string ascii;
  for (size_t pos = 0, size = 1; pos < out.size(); pos += size) {
    uint32_t cp = utf8::decode(out, pos, &size);
    if (cp < 0x80) {
      ascii += char(cp);
    } else if (cp < 0x10000) {
      ascii += fmt::format("\\u{:04x}", cp);
    } else {
      cp -= 0x10000;
      ascii += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
    }
  }
  return ascii;
}

}  // namespace sluice::jinja
