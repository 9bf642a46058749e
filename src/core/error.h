// Errors that reach the user. Every message names what was being read (file, field, tensor),
// what was expected and what was found, so the user can act on one line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace sluice {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace sluice
