// A PCRE2 pattern compiled in UTF mode with Unicode properties (\s, \w, \d follow Unicode, as the
// Oniguruma and Rust `regex` engines used by the reference tokenizers do; `$` is the end only).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::tok {

class Regex {
 public:
  // `where` names the file and field for errors.
  Regex(std::string pattern, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [begin, end) of all non-overlapping matches, left to right. Empty matches are
  // skipped. The subject should be valid UTF-8: invalid bytes are replaced before matching by
  // the callers (see Tokenizer::encode).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view subject) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*, kept opaque so this header stays free of pcre2.h
};

}  // namespace sluice::tok
