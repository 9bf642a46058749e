#include "io/jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "io/jinja/utf8.h"

namespace sluice::jinja {

const char* token_type_name(TokenType type) {
  switch (type) {
    case TokenType::kText:
      return "text";
    case TokenType::kVarBegin:
      return "'{{'";
    case TokenType::kVarEnd:
      return "'}}'";
    case TokenType::kBlockBegin:
      return "'{%'";
    case TokenType::kBlockEnd:
      return "'%}'";
    case TokenType::kName:
      return "name";
    case TokenType::kString:
      return "string";
    case TokenType::kInteger:
      return "integer";
    case TokenType::kFloat:
      return "float";
    case TokenType::kOperator:
      return "operator";
    case TokenType::kEnd:
      return "end of template";
  }
  return "token";
}

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// Jinja reads templates with universal newlines and, as keep_trailing_newline is off, drops one
// final newline.
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_newlines(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = find_tag(pos_);
      emit_text(pos_, tag);
      if (tag == src_.size()) break;
      char kind = src_[tag + 1];
      if (kind == '#') {
        lex_comment(tag);
      } else {
        lex_tag(tag, kind == '%');
      }
    }
    push(TokenType::kEnd, "", src_.size());
    return std::move(tokens_);
  }

 private:
  SourcePos pos_of(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = size_t(it - line_starts_.begin());
    return SourcePos{int(line), int(offset - line_starts_[line - 1] + 1)};
  }

  [[noreturn]] void error_at(size_t offset, const std::string& message) const {
    throw TemplateError(message, pos_of(offset));
  }

  Token& push(TokenType type, std::string value, size_t offset) {
    tokens_.push_back(Token{type, std::move(value), pos_of(offset)});
    return tokens_.back();
  }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  // Emits src_[begin, end) as text after the whitespace control of the tags around it.
  void emit_text(size_t begin, size_t end) {
    std::string text = src_.substr(begin, end - begin);
    size_t text_offset = begin;
    bool line_start = begin == 0 || last_tag_ended_line_;
    if (strip_leading_) {
      size_t n = 0;
      while (n < text.size() && is_space(text[n])) ++n;
      text.erase(0, n);
      text_offset += n;
    } else if (trim_newline_ && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
      text_offset += 1;
      line_start = true;
    }
    strip_leading_ = trim_newline_ = last_tag_ended_line_ = false;
    if (end < src_.size()) {
      char kind = src_[end + 1];
      char marker = end + 2 < src_.size() ? src_[end + 2] : '\0';
      if (marker == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (kind != '{' && marker != '+') {
        // lstrip_blocks: indentation alone on its line before a block or comment goes away.
        size_t line_begin = text.rfind('\n');
        line_begin = line_begin == std::string::npos ? 0 : line_begin + 1;
        bool only_indent = text.find_first_not_of(" \t", line_begin) == std::string::npos;
        if (only_indent && (line_begin > 0 || line_start)) text.erase(line_begin);
      }
    }
    if (!text.empty()) push(TokenType::kText, std::move(text), text_offset);
    pos_ = end;
  }

  // Handles what follows a tag's closing delimiter: "-" strips whitespace, "+" keeps it, and by
  // default (trim_blocks) a block or comment tag swallows one newline.
  void after_tag_end(char marker, bool is_block_or_comment) {
    if (marker == '-') {
      strip_leading_ = true;
    } else if (marker != '+' && is_block_or_comment) {
      trim_newline_ = true;
      last_tag_ended_line_ = pos_ < src_.size() && src_[pos_] == '\n';
    }
  }

  void lex_comment(size_t tag) {
    size_t close = src_.find("#}", tag + 2);
    if (close == std::string::npos) error_at(tag, "unterminated comment: expected '#}'");
    char marker = close > tag + 2 ? src_[close - 1] : '\0';
    pos_ = close + 2;
    after_tag_end(marker == '-' || marker == '+' ? marker : '\0', true);
  }

  void lex_tag(size_t tag, bool is_block) {
    size_t first_token = tokens_.size();
    push(is_block ? TokenType::kBlockBegin : TokenType::kVarBegin, is_block ? "{%" : "{{", tag);
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || (is_block && src_[p] == '+'))) ++p;
    int depth = 0;  // open brackets: a '}}' inside a dict literal does not end the tag
    const char close_char = is_block ? '%' : '}';
    for (;;) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size()) {
        error_at(tag, fmt::format("unterminated tag: expected '{}}}' before the end of template",
                                  close_char));
      }
      char marker = '\0';
      size_t q = p;
      if (depth == 0 && (src_[q] == '-' || (is_block && src_[q] == '+'))) {
        marker = src_[q];
        ++q;
      }
      if (depth == 0 && src_.compare(q, 2, is_block ? "%}" : "}}") == 0) {
        push(is_block ? TokenType::kBlockEnd : TokenType::kVarEnd, is_block ? "%}" : "}}", p);
        pos_ = q + 2;
        after_tag_end(marker, is_block);
        break;
      }
      p = lex_expression_token(p, depth);
    }
    if (is_block && tokens_.size() == first_token + 3 &&
        tokens_[first_token + 1].type == TokenType::kName &&
        tokens_[first_token + 1].value == "raw") {
      tokens_.resize(first_token);
      lex_raw_body(tag);
    }
  }

  // `{% raw %}...{% endraw %}`: the body is text, tags inside it are not interpreted.
  void lex_raw_body(size_t raw_tag) {
    for (size_t search = pos_;;) {
      size_t tag = src_.find("{%", search);
      if (tag == std::string::npos) error_at(raw_tag, "unterminated raw block: expected 'endraw'");
      size_t p = tag + 2;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        search = tag + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && is_space(src_[p])) ++p;
      char marker = '\0';
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) marker = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) {
        search = tag + 2;
        continue;
      }
      emit_text(pos_, tag);
      pos_ = p + 2;
      after_tag_end(marker, true);
      return;
    }
  }

  size_t lex_expression_token(size_t p, int& depth) {
    char c = src_[p];
    if (is_name_start(c)) {
      size_t e = p;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      push(TokenType::kName, src_.substr(p, e - p), p);
      return e;
    }
    if (is_digit(c)) return lex_number(p);
    if (c == '\'' || c == '"') return lex_string(p);
    static const char* const kTwoChar[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwoChar) {
      if (src_.compare(p, 2, op) == 0) {
        push(TokenType::kOperator, op, p);
        return p + 2;
      }
    }
    if (std::strchr("+-*/%~<>=()[]{},.:|", c) != nullptr) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
      push(TokenType::kOperator, std::string(1, c), p);
      return p + 1;
    }
    error_at(p, fmt::format("unexpected character '{}' inside a tag", c));
  }

  size_t lex_number(size_t p) {
    size_t e = p;
    auto digits = [&] {
      while (e < src_.size() && (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() &&
                                                       is_digit(src_[e + 1])))) {
        ++e;
      }
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && is_digit(src_[x])) {
        is_float = true;
        e = x;
        digits();
      }
    }
    std::string text = src_.substr(p, e - p);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    Token& token = push(is_float ? TokenType::kFloat : TokenType::kInteger, text, p);
    if (is_float) {
      token.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
      if (errno != 0 || v > uint64_t(INT64_MAX)) error_at(p, "integer literal too large");
      token.int_value = int64_t(v);
    }
    return e;
  }

  // A quoted string with Python's escapes (Jinja decodes literals with "unicode-escape").
  size_t lex_string(size_t start) {
    char quote = src_[start];
    std::string value;
    size_t p = start + 1;
    auto hex = [&](size_t at, int n, uint32_t* out) {
      if (at + size_t(n) > src_.size()) return false;
      uint32_t v = 0;
      for (int i = 0; i < n; ++i) {
        char h = src_[at + size_t(i)];
        int d = is_digit(h)              ? h - '0'
                : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                         : -1;
        if (d < 0) return false;
        v = v * 16 + uint32_t(d);
      }
      *out = v;
      return true;
    };
    for (;;) {
      if (p >= src_.size()) error_at(start, "unterminated string literal");
      char c = src_[p];
      if (c == quote) break;
      if (c != '\\' || p + 1 >= src_.size()) {
        value += c;
        ++p;
        continue;
      }
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n':
          break;  // line continuation
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'n':
          value += '\n';
          break;
        case 'r':
          value += '\r';
          break;
        case 't':
          value += '\t';
          break;
        case 'v':
          value += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          if (!hex(p, n, &cp) || cp > 0x10ffff) {
            error_at(p - 2, fmt::format("truncated \\{} escape in string literal", e));
          }
          utf8::append(value, cp);
          p += size_t(n);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int i = 0; i < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++i) {
              cp = cp * 8 + uint32_t(src_[p++] - '0');
            }
            utf8::append(value, cp);
          } else {
            value += '\\';  // Python keeps unknown escapes as written
            value += e;
          }
      }
    }
    push(TokenType::kString, std::move(value), start);
    return p + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool strip_leading_ = false;        // the previous tag ended with '-'
  bool trim_newline_ = false;         // the previous tag was a block or comment (trim_blocks)
  bool last_tag_ended_line_ = false;  // ... and the newline it swallowed ended the line
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) {
  return Lexer(source).run();
}

}  // namespace sluice::jinja
