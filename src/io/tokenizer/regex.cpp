#include "io/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace sluice::tok {

Regex::Regex(std::string pattern, std::string_view where) : pattern_(std::move(pattern)) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_UTF_CHECK,
                        &error_code, &error_offset, nullptr);
  if (!code_) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail("{}: regex '{}': does not compile at offset {}: {}", where, pattern_, error_offset,
         reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(static_cast<pcre2_code*>(code_), PCRE2_JIT_COMPLETE);  // optional speed-up
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view subject) const {
  std::vector<std::pair<size_t, size_t>> matches;
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  size_t offset = 0;
  while (offset <= subject.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                               offset, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a matching-limit error: no further matches
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      offset = end;
    } else {
      // Empty match: step over one whole character.
      if (begin >= subject.size()) break;
      offset = begin + 1;
      while (offset < subject.size() &&
             (static_cast<unsigned char>(subject[offset]) & 0xC0) == 0x80)
        ++offset;
    }
  }
  pcre2_match_data_free(data);
  return matches;
}

}  // namespace sluice::tok
