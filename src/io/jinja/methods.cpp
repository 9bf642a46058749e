#include <algorithm>
#include <cctype>
#include <ctime>
#include <memory>
#include <optional>

#include "io/jinja/builtins.h"
#include "io/jinja/template_error.h"
#include "io/jinja/utf8.h"

namespace sluice::jinja {
namespace {

// Jinja's sandbox (range is capped at MAX_RANGE = 100000 there too).
constexpr int64_t kMaxRange = 100000;

Value make_function(Function f) {
  return Value(std::make_shared<const Function>(std::move(f)));
}

std::string string_arg(const CallArgs& args, size_t index, const char* name) {
  Value v = args.get(index, name);
  if (!v.is_string()) {
    raise("{}() argument '{}' must be str, not {}", args.callee, name, v.type_name());
  }
  return v.as_string();
}

std::string ascii_map(std::string s, int (*f)(int)) {
  for (char& c : s) {
    if (uint8_t(c) < 0x80) c = char(f(c));
  }
  return s;
}

std::string title_case(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    bool is_alpha = std::isalpha(uint8_t(c)) != 0 && uint8_t(c) < 0x80;
    if (is_alpha) c = char(prev_cased ? std::tolower(c) : std::toupper(c));
    prev_cased = is_alpha;
  }
  return out;
}

List split_whitespace(const std::string& s, int64_t maxsplit) {
  List parts;
  std::vector<size_t> offsets = utf8::code_point_offsets(s);
  auto space_at = [&](size_t i) {
    size_t size = 1;
    return utf8::is_python_space(utf8::decode(s, offsets[i], &size));
  };
  size_t n = offsets.size() - 1, i = 0;
  while (i < n) {
    while (i < n && space_at(i)) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
      size_t end = n;
      while (end > i && space_at(end - 1)) --end;
      parts.emplace_back(s.substr(offsets[i], offsets[end] - offsets[i]));
      break;
    }
    size_t j = i;
    while (j < n && !space_at(j)) ++j;
    parts.emplace_back(s.substr(offsets[i], offsets[j] - offsets[i]));
    i = j;
  }
  return parts;
}

List split_on(const std::string& s, const std::string& sep, int64_t maxsplit, bool from_right) {
  if (sep.empty()) raise("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    for (;;) {
      size_t hit = maxsplit >= 0 && int64_t(parts.size()) >= maxsplit ? std::string::npos
                                                                      : s.find(sep, start);
      if (hit == std::string::npos) break;
      parts.push_back(s.substr(start, hit - start));
      start = hit + sep.size();
    }
    parts.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    for (;;) {
      size_t hit = (maxsplit >= 0 && int64_t(parts.size()) >= maxsplit) || end < sep.size()
                       ? std::string::npos
                       : s.rfind(sep, end - sep.size());
      if (hit == std::string::npos) break;
      parts.push_back(s.substr(hit + sep.size(), end - hit - sep.size()));
      end = hit;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  List out;
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

int64_t int_arg(const CallArgs& args, size_t index, const char* name, int64_t fallback) {
  Value v = args.get(index, name);
  if (v.is_undefined() || v.is_none()) return fallback;
  if (!v.is_int() && !v.is_bool()) raise("{}() argument '{}' must be int", args.callee, name);
  return v.as_int();
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const std::string& callee) {
  auto one = [&](const Value& a) {
    if (!a.is_string())
      raise("{}() argument must be str or a tuple of str, not {}", callee, a.type_name());
    const std::string& x = a.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    for (const Value& a : affix.as_list()) {
      if (one(a)) return true;
    }
    return false;
  }
  return one(affix);
}

// str.strip / lstrip / rstrip (name says which).
Value strip_method(const std::string& s, const std::string& name, CallArgs& args) {
  args.expect_at_most(1);
  Value chars = args.get(0, "chars");
  if (!chars.is_undefined() && !chars.is_none() && !chars.is_string()) {
    raise("{} arg must be None or str", name);
  }
  const std::string* set = chars.is_string() ? &chars.as_string() : nullptr;
  return Value(strip(s, set, name != "rstrip", name != "lstrip"));
}

// str.split / rsplit (name says which).
Value split_method(const std::string& s, const std::string& name, CallArgs& args) {
  args.expect_at_most(2);
  Value sep = args.get(0, "sep");
  int64_t maxsplit = int_arg(args, 1, "maxsplit", -1);
  if (sep.is_undefined() || sep.is_none()) {
    if (name == "rsplit" && maxsplit >= 0) raise("rsplit() without a separator is not supported");
    return Value(split_whitespace(s, maxsplit));
  }
  if (!sep.is_string()) raise("must be str or None, not {}", sep.type_name());
  return Value(split_on(s, sep.as_string(), maxsplit, name == "rsplit"));
}

Value capitalize(const std::string& s) {
  std::string out = ascii_map(s, ::tolower);
  if (!out.empty() && uint8_t(out[0]) < 0x80) out[0] = char(std::toupper(out[0]));
  return Value(out);
}

// str.replace(old, new[, count]); Python inserts `new` before every code point and at the end
// when `old` is empty.
Value replace_method(const std::string& s, CallArgs& args) {
  std::string old_text = string_arg(args, 0, "old");
  std::string new_text = string_arg(args, 1, "new");
  int64_t count = int_arg(args, 2, "count", -1);
  std::string out;
  if (old_text.empty()) {
    std::vector<size_t> offsets = utf8::code_point_offsets(s);
    for (size_t i = 0; i < offsets.size(); ++i) {
      if (count < 0 || int64_t(i) < count) out += new_text;
      if (i + 1 < offsets.size()) out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
      if (out.size() > kMaxValueBytes) raise("value larger than {} bytes", kMaxValueBytes);
    }
    return Value(out);
  }
  size_t start = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    size_t hit = s.find(old_text, start);
    if (hit == std::string::npos) break;
    out.append(s, start, hit - start);
    out += new_text;
    start = hit + old_text.size();
    if (out.size() > kMaxValueBytes) raise("value larger than {} bytes", kMaxValueBytes);
  }
  out.append(s, start);
  return Value(out);
}

// str.find(sub): the index in code points, or -1.
Value find_method(const std::string& s, CallArgs& args) {
  size_t hit = s.find(string_arg(args, 0, "sub"));
  return Value(hit == std::string::npos ? int64_t(-1) : int64_t(utf8::length(s.substr(0, hit))));
}

// str.count(sub): non-overlapping occurrences; an empty `sub` matches between every code point.
Value count_method(const std::string& s, CallArgs& args) {
  std::string sub = string_arg(args, 0, "sub");
  if (sub.empty()) return Value(int64_t(utf8::length(s) + 1));
  int64_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
  return Value(n);
}

// sep.join(iterable), every item a string.
Value join_method(const std::string& sep, CallArgs& args) {
  std::string out;
  bool first = true;
  for (const Value& item : iterate(args.get(0, "iterable"))) {
    if (!item.is_string())
      raise("sequence item: expected str instance, {} found", item.type_name());
    if (!first) out += sep;
    out += item.as_string();
    first = false;
    if (out.size() > kMaxValueBytes) raise("value larger than {} bytes", kMaxValueBytes);
  }
  return Value(out);
}

// str.isdigit / isalpha / isalnum / isspace (ASCII classes); nullopt for another name.
std::optional<Value> char_class_test(const std::string& s, const std::string& name) {
  bool (*pred)(uint8_t) = nullptr;
  if (name == "isdigit") pred = [](uint8_t c) { return c >= '0' && c <= '9'; };
  if (name == "isalpha") pred = [](uint8_t c) { return c < 0x80 && std::isalpha(c) != 0; };
  if (name == "isalnum") pred = [](uint8_t c) { return c < 0x80 && std::isalnum(c) != 0; };
  if (name == "isspace") pred = [](uint8_t c) { return utf8::is_python_space(c); };
  if (!pred) return std::nullopt;
  if (s.empty()) return Value(false);
  for (char c : s) {
    if (!pred(uint8_t(c))) return Value(false);
  }
  return Value(true);
}

Value string_method(const std::string& s, const std::string& name, CallArgs& args) {
  if (name == "startswith" || name == "endswith") {
    args.expect_at_most(1);
    return Value(affix_match(s, args.get(0, "prefix"), name == "startswith", name));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") return strip_method(s, name, args);
  if (name == "split" || name == "rsplit") return split_method(s, name, args);
  if (name == "upper") return Value(ascii_map(s, ::toupper));
  if (name == "lower") return Value(ascii_map(s, ::tolower));
  if (name == "title") return Value(title_case(s));
  if (name == "capitalize") return capitalize(s);
  if (name == "replace") return replace_method(s, args);
  if (name == "find") return find_method(s, args);
  if (name == "count") return count_method(s, args);
  if (name == "join") return join_method(s, args);
  if (std::optional<Value> v = char_class_test(s, name)) return *v;
  raise("str has no method '{}'", name);
}

Value dict_method(const Value& obj, const std::string& name, CallArgs& args) {
  const Dict& d = obj.as_dict();
  if (name == "items") {
    List out;
    for (const auto& [k, v] : d.items) out.emplace_back(List{Value(k), v});
    return Value(std::move(out));
  }
  if (name == "keys") return Value(iterate(obj));
  if (name == "values") {
    List out;
    for (const auto& kv : d.items) out.push_back(kv.second);
    return Value(std::move(out));
  }
  // get
  args.expect_at_most(2);
  Value key = args.get(0, "key");
  if (key.is_string()) {
    if (const Value* v = d.find(key.as_string())) return *v;
  }
  return args.get(1, "default", Value::none());
}

bool is_one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

}  // namespace

Value bound_method(const Value& obj, const std::string& name) {
  const char* type = nullptr;
  if (obj.is_string()) {
    if (is_one_of(name, {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
                         "upper", "lower", "title", "capitalize", "replace", "find", "count",
                         "join", "isdigit", "isalpha", "isalnum", "isspace"})) {
      return make_function([s = obj.as_string(), name](CallArgs& args) {
        args.callee = name;
        return string_method(s, name, args);
      });
    }
    type = "str";
  } else if (obj.is_dict()) {
    if (is_one_of(name, {"items", "keys", "values", "get"})) {
      return make_function([obj, name](CallArgs& args) {
        args.callee = name;
        return dict_method(obj, name, args);
      });
    }
    if (is_one_of(name, {"pop", "popitem", "update", "clear", "setdefault"})) type = "dict";
  } else if (obj.is_list()) {
    if (is_one_of(name,
                  {"append", "extend", "pop", "insert", "remove", "clear", "sort", "reverse"})) {
      type = "list";
    }
  }
  if (type && !obj.is_string()) {
    // transformers renders in Jinja's ImmutableSandboxedEnvironment, which refuses these.
    return make_function([type, name](CallArgs&) -> Value {
      raise("access to attribute '{}' of '{}' object is unsafe: templates cannot modify data", name,
            type);
    });
  }
  return Value::undefined("");
}

std::unordered_map<std::string, Value> make_globals() {
  std::unordered_map<std::string, Value> g;
  g["range"] = make_function([](CallArgs& args) {
    args.callee = "range";
    if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
      raise("range() expects 1 to 3 positional integer arguments");
    }
    for (const Value& v : args.positional) {
      if (!v.is_int() && !v.is_bool())
        raise("range() arguments must be integers, not {}", v.type_name());
    }
    int64_t start = 0, stop, step = 1;
    if (args.positional.size() == 1) {
      stop = args.positional[0].as_int();
    } else {
      start = args.positional[0].as_int();
      stop = args.positional[1].as_int();
      if (args.positional.size() == 3) step = args.positional[2].as_int();
    }
    if (step == 0) raise("range() arg 3 must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (int64_t(out.size()) >= kMaxRange) {
        raise("range too big: the sandbox allows at most {} items", kMaxRange);
      }
      out.emplace_back(i);
    }
    return Value(std::move(out));
  });
  g["namespace"] = make_function([](CallArgs& args) {
    auto ns = std::make_shared<Namespace>();
    for (const Value& v : args.positional) {
      if (!v.is_dict())
        raise("namespace() positional arguments must be dicts, not {}", v.type_name());
      for (const auto& [k, item] : v.as_dict().items) ns->attrs.set(k, item);
    }
    for (const auto& [k, item] : args.keyword) ns->attrs.set(k, item);
    return Value(ns);
  });
  g["dict"] = make_function([](CallArgs& args) {
    Dict d;
    for (const Value& v : args.positional) {
      if (!v.is_dict()) raise("dict() positional arguments must be dicts, not {}", v.type_name());
      for (const auto& [k, item] : v.as_dict().items) d.set(k, item);
    }
    for (const auto& [k, item] : args.keyword) d.set(k, item);
    return Value(std::move(d));
  });
  g["raise_exception"] = make_function([](CallArgs& args) -> Value {
    throw TemplateError("template raised an exception: " + args.get(0, "message").str());
  });
  g["strftime_now"] = make_function([](CallArgs& args) {
    Value format = args.get(0, "format");
    if (!format.is_string()) raise("strftime_now() expects a format string");
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    size_t n = std::strftime(buf, sizeof buf, format.as_string().c_str(), &local);
    return Value(std::string(buf, n));
  });
  return g;
}

}  // namespace sluice::jinja
