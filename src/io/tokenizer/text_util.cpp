#include "io/tokenizer/text_util.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "core/error.h"

namespace sluice::tok {

size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

namespace {

// Length of the valid character at s[i]; 0 when invalid; -1 when valid but cut short by the end.
int valid_char_length(std::string_view s, size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  if (lead < 0x80) return 1;
  int n;
  char32_t min;
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2, min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    n = 3, min = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4, min = 0x10000;
  } else {
    return 0;
  }
  char32_t cp = lead & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -1;
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
    // Reject overlong forms, surrogates and values past U+10FFFF as soon as they are decided.
    if (k == 1 && n == 3 && ((lead == 0xE0 && c < 0xA0) || (lead == 0xED && c >= 0xA0))) return 0;
    if (k == 1 && n == 4 && ((lead == 0xF0 && c < 0x90) || (lead == 0xF4 && c >= 0x90))) return 0;
  }
  if (cp < min) return 0;
  return n;
}

}  // namespace

size_t complete_utf8_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const int n = valid_char_length(s, i);
    if (n <= 0) break;
    i += n;
  }
  return i;
}

bool ends_with_incomplete_utf8(std::string_view s) {
  // Only the last three bytes can start an unfinished character.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t i = s.size() - back;
    const auto c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) == 0x80) continue;
    return valid_char_length(s, i) == -1;
  }
  return false;
}

bool is_valid_utf8(std::string_view s) {
  return complete_utf8_prefix(s) == s.size();
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const int n = valid_char_length(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    out += "\xEF\xBF\xBD";
    // A maximal invalid prefix counts as one error: skip the continuation bytes that followed
    // a plausible lead byte.
    size_t skip = 1;
    const size_t want = utf8_sequence_length(static_cast<unsigned char>(s[i]));
    while (skip < want && i + skip < s.size() &&
           (static_cast<unsigned char>(s[i + skip]) & 0xC0) == 0x80 &&
           valid_char_length(s.substr(0, i + skip + 1), i) != 0)
      ++skip;
    i += skip;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

char32_t next_codepoint(std::string_view s, size_t& i) {
  const int n = valid_char_length(s, i);
  if (n <= 0) {
    ++i;
    return 0xFFFD;
  }
  const auto lead = static_cast<unsigned char>(s[i]);
  char32_t cp = n == 1 ? lead : lead & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

namespace {

// Printable bytes stand for themselves; the others are shifted to U+0100 and up, in byte order.
std::array<char32_t, 256> make_byte_codepoints() {
  std::array<char32_t, 256> cps{};
  char32_t next_free = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    cps[b] = printable ? static_cast<char32_t>(b) : next_free++;
  }
  return cps;
}

const std::array<char32_t, 256>& byte_codepoints() {
  static const auto cps = make_byte_codepoints();
  return cps;
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() {
  static const auto table = [] {
    std::array<std::string, 256> t;
    for (int b = 0; b < 256; ++b) append_utf8(t[b], byte_codepoints()[b]);
    return t;
  }();
  return table;
}

int unicode_to_byte(char32_t cp) {
  static const auto inverse = [] {
    std::array<int16_t, 512> inv;
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) inv[byte_codepoints()[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += byte_to_unicode()[c];
  return out;
}

std::string byte_level_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = i;
    const char32_t cp = next_codepoint(text, i);
    const int b = unicode_to_byte(cp);
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out.append(text.substr(start, i - start));
    }
  }
  return out;
}

std::string nfc(std::string_view text, std::string_view where) {
  bool ascii = true;
  for (unsigned char c : text) ascii = ascii && c < 0x80;
  if (ascii) return std::string(text);  // ASCII is always in NFC
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) fail("{}: normalizer 'NFC': ICU could not load NFC data", where);
  const auto input = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size()));
  const icu::UnicodeString normalized = normalizer->normalize(input, status);
  if (U_FAILURE(status)) fail("{}: normalizer 'NFC': ICU failed on the input", where);
  std::string out;
  normalized.toUTF8String(out);
  return out;
}

}  // namespace sluice::tok
