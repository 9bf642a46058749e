// Checked reads of JSON numbers. nlohmann's get<int>() and get<float>() convert whatever number
// the document holds with a C++ cast, which is undefined behaviour for a value outside the
// target's range (a 1e300 where an id belongs: found by fuzz_tokenizer_json). Every reader of an
// untrusted file takes its numbers through these.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace sluice {

// The value of `v` if it is a JSON integer (not a float such as 3.0) within [lo, hi].
template <class Json>
std::optional<int64_t> json_integer(const Json& v, int64_t lo = std::numeric_limits<int64_t>::min(),
                                    int64_t hi = std::numeric_limits<int64_t>::max()) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.template get<uint64_t>();
    if (hi < 0 || u > uint64_t(hi) || int64_t(u) < lo) return std::nullopt;
    return int64_t(u);
  }
  if (!v.is_number_integer()) return std::nullopt;
  const int64_t i = v.template get<int64_t>();
  if (i < lo || i > hi) return std::nullopt;
  return i;
}

// The value of `v` as a float if it is a finite JSON number within float's range.
template <class Json>
std::optional<float> json_float(const Json& v) {
  if (!v.is_number()) return std::nullopt;
  const double d = v.template get<double>();
  if (!std::isfinite(d) || std::fabs(d) > double(std::numeric_limits<float>::max()))
    return std::nullopt;
  return float(d);
}

// `v` as an error message shows it: JSON text, invalid UTF-8 replaced, cut at 60 characters.
template <class Json>
std::string json_excerpt(const Json& v) {
  std::string shown = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  return shown;
}

}  // namespace sluice
