// Errors raised while lexing, parsing or rendering a template. They carry the template position
// once known; ChatTemplate turns them into sluice::Error prefixed with "origin:line:col:".
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace sluice::jinja {

struct SourcePos {
  int line = 0;  // 1-based; 0 while unknown
  int column = 0;
};

class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& message, SourcePos pos = {})
      : std::runtime_error(message), pos_(pos) {}
  const SourcePos& pos() const { return pos_; }
  // The innermost construct that knows its position sets it; outer ones keep it.
  void locate(SourcePos pos) {
    if (pos_.line == 0) pos_ = pos;
  }

 private:
  SourcePos pos_;
};

template <typename... Args>
[[noreturn]] void raise(fmt::format_string<Args...> format, Args&&... args) {
  throw TemplateError(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace sluice::jinja
