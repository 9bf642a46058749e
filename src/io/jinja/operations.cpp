#include <algorithm>
#include <cmath>
#include <optional>

#include "io/jinja/builtins.h"
#include "io/jinja/template_error.h"
#include "io/jinja/utf8.h"

namespace sluice::jinja {

void fail_undefined(const Value& v) {
  throw TemplateError(v.undefined_what().empty() ? "value is undefined" : v.undefined_what());
}

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  raise("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

// Python ints do not overflow; ours are 64-bit, so overflow is an error rather than a wrap.
int64_t checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) raise("integer overflow");
  return r;
}
int64_t checked_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) raise("integer overflow");
  return r;
}
int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) raise("integer overflow");
  return r;
}

void check_size(size_t bytes) {
  if (bytes > kMaxValueBytes) raise("value larger than {} bytes", kMaxValueBytes);
}

Value repeat(const Value& seq, int64_t n) {
  if (n <= 0) return seq.is_string() ? Value("") : Value(List{});
  if (seq.is_string()) {
    check_size(seq.as_string().size() * size_t(std::min<int64_t>(n, int64_t(kMaxValueBytes) + 1)));
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  check_size(seq.as_list().size() * 64 * size_t(std::min<int64_t>(n, int64_t(kMaxValueBytes) + 1)));
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return Value(std::move(out));
}

int64_t int_power(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) result = checked_mul(result, base);
    exp >>= 1;
    if (exp > 0) base = checked_mul(base, base);
  }
  return result;
}

// Python ordering: numbers by value, strings by code point (= UTF-8 byte order), lists
// lexicographically. Returns <0, 0 or >0.
int order(const Value& a, const Value& b, const std::string& op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.as_string().compare(b.as_string());
  if (a.is_list() && b.is_list()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return order(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  raise("'{}' not supported between instances of '{}' and '{}'", op, a.type_name(), b.type_name());
}

// Python's index normalisation: negative counts from the end; out of range gives npos.
size_t normalize_index(int64_t index, size_t size) {
  if (index < 0) index += int64_t(size);
  if (index < 0 || size_t(index) >= size) return std::string::npos;
  return size_t(index);
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  const bool numbers = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value(checked_add(a.as_int(), b.as_int()));
    if (numbers) return Value(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_size(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && !a.is_generator() && !b.is_generator()) {
      check_size((a.as_list().size() + b.as_list().size()) * sizeof(Value));
      List out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value(std::move(out));
    }
    if (a.is_string() || b.is_string()) {
      raise("can only concatenate str (not \"{}\") to str",
            a.is_string() ? b.type_name() : a.type_name());
    }
    unsupported(op, a, b);
  }
  if (op == "-") {
    if (ints) return Value(checked_sub(a.as_int(), b.as_int()));
    if (numbers) return Value(a.as_double() - b.as_double());
    unsupported(op, a, b);
  }
  if (op == "*") {
    if (ints) return Value(checked_mul(a.as_int(), b.as_int()));
    if (numbers) return Value(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
    unsupported(op, a, b);
  }
  if (op == "/") {
    if (!numbers) unsupported(op, a, b);
    if (b.as_double() == 0.0) raise("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (a.is_string() && op == "%")
      raise("printf-style string formatting with '%' is not supported");
    if (!numbers) unsupported(op, a, b);
    if (ints) {
      int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) raise("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) raise("integer overflow");
      int64_t q = x / y;
      if (x % y != 0 && ((x < 0) != (y < 0))) --q;  // Python floors toward negative infinity
      return op == "//" ? Value(q) : Value(x - q * y);
    }
    double x = a.as_double(), y = b.as_double();
    if (y == 0.0) raise("float division by zero");
    double m = std::fmod(x, y);
    if (m != 0.0 && ((y < 0) != (m < 0))) m += y;
    return op == "//" ? Value(std::floor(x / y)) : Value(m);
  }
  if (op == "**") {
    if (!numbers) unsupported(op, a, b);
    if (ints && b.as_int() >= 0) return Value(int_power(a.as_int(), b.as_int()));
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  raise("unknown operator '{}'", op);
}

bool compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  int c = order(a, b, op);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

Value negate(const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_float()) return Value(-v.as_double());
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) raise("integer overflow");
    return Value(-v.as_int());
  }
  raise("bad operand type for unary -: '{}'", v.type_name());
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      if (item.is_undefined()) fail_undefined(item);
      raise("'in <string>' requires string as left operand, not {}", item.type_name());
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.as_dict().find(item.as_string());
  if (container.is_list()) {
    for (const Value& v : container.as_list()) {
      if (equals(v, item)) return true;
    }
    return false;
  }
  if (container.is_undefined()) return false;
  raise("argument of type '{}' is not iterable", container.type_name());
}

List iterate(const Value& v) {
  if (v.is_list()) return v.as_list();
  if (v.is_undefined()) return {};
  if (v.is_dict()) {
    List keys;
    for (const auto& item : v.as_dict().items) keys.emplace_back(item.first);
    return keys;
  }
  if (v.is_string()) {
    const std::string& s = v.as_string();
    std::vector<size_t> offsets = utf8::code_point_offsets(s);
    List chars;
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      chars.emplace_back(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
    }
    return chars;
  }
  raise("'{}' object is not iterable", v.type_name());
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
      return Value::undefined(fmt::format("'dict object' has no attribute '{}'", key.as_string()));
    }
    return Value::undefined(fmt::format("'dict object' has no element {}", key.repr()));
  }
  if (obj.is_namespace() && key.is_string()) return get_attribute(obj, key.as_string());
  if (((obj.is_list() && !obj.is_generator()) || obj.is_string()) &&
      (key.is_int() || key.is_bool())) {
    if (obj.is_list()) {
      size_t i = normalize_index(key.as_int(), obj.as_list().size());
      if (i != std::string::npos) return obj.as_list()[i];
    } else {
      const std::string& s = obj.as_string();
      std::vector<size_t> offsets = utf8::code_point_offsets(s);
      size_t i = normalize_index(key.as_int(), offsets.size() - 1);
      if (i != std::string::npos) return Value(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
    }
    return Value::undefined(
        fmt::format("'{} object' has no element {}", obj.type_name(), key.repr()));
  }
  if (key.is_string()) return get_attribute(obj, key.as_string());
  return Value::undefined(
      fmt::format("'{} object' has no element {}", obj.type_name(), key.repr()));
}

Value get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  // Jinja tries the Python attribute first, so `d.items` is the method even when d has an
  // "items" key; other names fall back to the item.
  Value method = bound_method(obj, name);
  if (!method.is_undefined()) return method;
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.as_namespace().attrs.find(name)) return *v;
  }
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", obj.type_name(), name));
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool())
      raise("slice {} must be an integer or None, got {}", what, v.type_name());
    return v.as_int();
  };
  std::optional<int64_t> start = as_index(start_v, "start"), stop = as_index(stop_v, "stop");
  int64_t step = as_index(step_v, "step").value_or(1);
  if (step == 0) raise("slice step cannot be zero");
  std::vector<size_t> offsets;
  int64_t size;
  if (obj.is_string()) {
    offsets = utf8::code_point_offsets(obj.as_string());
    size = int64_t(offsets.size()) - 1;
  } else if (obj.is_list()) {
    size = int64_t(obj.as_list().size());
  } else {
    raise("'{}' object is not subscriptable", obj.type_name());
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0) {
      x += size;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= size) {
      x = step < 0 ? size - 1 : size;
    }
    return x;
  };
  int64_t first = adjust(start, step < 0 ? size - 1 : 0);
  int64_t last = adjust(stop, step < 0 ? -1 : size);
  std::vector<int64_t> picked;
  for (int64_t i = first; step > 0 ? i < last : i > last; i += step) picked.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : picked) {
      out.append(obj.as_string(), offsets[size_t(i)], offsets[size_t(i) + 1] - offsets[size_t(i)]);
    }
    return Value(std::move(out));
  }
  List out;
  for (int64_t i : picked) out.push_back(obj.as_list()[size_t(i)]);
  return Value(std::move(out));
}

std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<size_t> offsets = utf8::code_point_offsets(s);
  std::vector<uint32_t> strip_set;
  if (chars) {
    for (size_t pos = 0, size = 1; pos < chars->size(); pos += size) {
      strip_set.push_back(utf8::decode(*chars, pos, &size));
    }
  }
  auto strippable = [&](size_t i) {
    size_t size = 1;
    uint32_t cp = utf8::decode(s, offsets[i], &size);
    if (!chars) return utf8::is_python_space(cp);
    return std::find(strip_set.begin(), strip_set.end(), cp) != strip_set.end();
  };
  size_t begin = 0, end = offsets.size() - 1;
  if (left) {
    while (begin < end && strippable(begin)) ++begin;
  }
  if (right) {
    while (end > begin && strippable(end - 1)) --end;
  }
  return s.substr(offsets[begin], offsets[end] - offsets[begin]);
}

}  // namespace sluice::jinja
