#include "io/tokenizer/pipeline.h"

#include "core/error.h"
#include "io/tokenizer/text_util.h"

namespace sluice::tok {

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out.append(to);
  }
  out.append(s, pos);
  s = std::move(out);
}

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace

std::string normalize(const std::vector<NormalizerStep>& steps, std::string text,
                      std::string_view where) {
  for (const auto& step : steps) {
    std::visit(Overloaded{
                   [&](const Prepend& p) {
                     if (!text.empty()) text = p.text + text;
                   },
                   [&](const Replace& r) { replace_all(text, r.from, r.to); },
                   [&](const Nfc&) { text = nfc(text, where); },
               },
               step);
  }
  return text;
}

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Splits one piece at the given match ranges according to `behavior`.
void split_piece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Piece>& out) {
  struct Segment {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Segment> segments;
  size_t pos = 0;
  for (auto [b, e] : matches) {
    if (b > pos) segments.push_back({pos, b, invert});
    segments.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < piece.text.size()) segments.push_back({pos, piece.text.size(), invert});

  std::vector<Segment> merged;
  for (const Segment& s : segments) {
    switch (behavior) {
      case SplitBehavior::kRemoved:
        if (!s.is_match) merged.push_back(s);
        break;
      case SplitBehavior::kIsolated:
        merged.push_back(s);
        break;
      case SplitBehavior::kMergedWithPrevious:
        if (s.is_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back({s.begin, s.end, false});
        }
        break;
      case SplitBehavior::kMergedWithNext:
        if (!merged.empty() && merged.back().is_match) {
          merged.back().end = s.end;
          merged.back().is_match = s.is_match;
        } else {
          merged.push_back(s);
        }
        break;
      case SplitBehavior::kContiguous:
        if (s.is_match && !merged.empty() && merged.back().is_match) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        break;
    }
  }
  for (const Segment& s : merged) {
    if (s.end > s.begin)
      out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
  }
}

const Regex& gpt2_regex() {
  static const Regex regex(kGpt2Pattern, "ByteLevel pre-tokenizer");
  return regex;
}

const Regex& digits_regex(bool individual) {
  static const Regex one(R"(\p{Nd})", "Digits pre-tokenizer");
  static const Regex run(R"(\p{Nd}+)", "Digits pre-tokenizer");
  return individual ? one : run;
}

}  // namespace

std::vector<Piece> pre_tokenize(const std::vector<PreTokenizerStep>& steps,
                                std::vector<Piece> pieces) {
  for (const auto& step : steps) {
    std::vector<Piece> next;
    for (Piece& piece : pieces) {
      std::visit(
          Overloaded{
              [&](const Split& s) {
                split_piece(piece, s.regex->find_all(piece.text), s.behavior, s.invert, next);
              },
              [&](const Digits& d) {
                split_piece(piece, digits_regex(d.individual).find_all(piece.text),
                            SplitBehavior::kIsolated, false, next);
              },
              [&](const ByteLevel& b) {
                if (b.add_prefix_space && !piece.text.starts_with(' '))
                  piece.text = " " + piece.text;
                std::vector<Piece> parts;
                if (b.use_regex) {
                  split_piece(piece, gpt2_regex().find_all(piece.text), SplitBehavior::kIsolated,
                              false, parts);
                } else {
                  parts.push_back(std::move(piece));
                }
                for (Piece& p : parts) next.push_back({bytes_to_byte_level(p.text), p.at_start});
              },
              [&](const Metaspace& m) {
                replace_all(piece.text, " ", m.replacement);
                const bool prepend = m.prepend == PrependScheme::kAlways ||
                                     (m.prepend == PrependScheme::kFirst && piece.at_start);
                if (prepend && !piece.text.starts_with(m.replacement))
                  piece.text = m.replacement + piece.text;
                if (!m.split) {
                  next.push_back(std::move(piece));
                  return;
                }
                // Each replacement character starts a new piece.
                size_t begin = 0;
                for (size_t hit = piece.text.find(m.replacement, 1); hit != std::string::npos;
                     hit = piece.text.find(m.replacement, hit + 1)) {
                  next.push_back(
                      {piece.text.substr(begin, hit - begin), piece.at_start && begin == 0});
                  begin = hit;
                }
                next.push_back({piece.text.substr(begin), piece.at_start && begin == 0});
              },
          },
          step);
    }
    pieces = std::move(next);
  }
  return pieces;
}

namespace {

// "<0x41>" -> 0x41; -1 when the token is not a byte token.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  int value = 0;
  for (char c : t.substr(3, 2)) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + d;
  }
  return value;
}

std::string join(const std::vector<std::string>& tokens) {
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

// Removes up to `n` copies of `c` from the start (from_start) or end of `s`.
void strip_chars(std::string& s, std::string_view c, int n, bool from_start) {
  for (int k = 0; k < n && !c.empty(); ++k) {
    if (from_start && s.starts_with(c)) {
      s.erase(0, c.size());
    } else if (!from_start && s.ends_with(c)) {
      s.erase(s.size() - c.size());
    } else {
      break;
    }
  }
}

}  // namespace

std::string decode_tokens(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens) {
  for (const auto& step : steps) {
    std::visit(Overloaded{
                   [&](const ByteLevelDecoder&) { tokens = {byte_level_to_bytes(join(tokens))}; },
                   [&](const ReplaceDecoder& r) {
                     for (auto& t : tokens) replace_all(t, r.from, r.to);
                   },
                   [&](const ByteFallbackDecoder&) {
                     // Runs of <0xXX> tokens become the bytes they name.
                     std::vector<std::string> out;
                     bool in_bytes = false;
                     for (auto& t : tokens) {
                       const int b = parse_byte_token(t);
                       if (b >= 0) {
                         if (!in_bytes) out.emplace_back();
                         out.back() += static_cast<char>(b);
                         in_bytes = true;
                       } else {
                         out.push_back(std::move(t));
                         in_bytes = false;
                       }
                     }
                     tokens = std::move(out);
                   },
                   [&](const FuseDecoder&) { tokens = {join(tokens)}; },
                   [&](const StripDecoder& s) {
                     for (auto& t : tokens) {
                       strip_chars(t, s.content, s.start, true);
                       strip_chars(t, s.content, s.stop, false);
                     }
                   },
                   [&](const MetaspaceDecoder& m) {
                     for (size_t i = 0; i < tokens.size(); ++i) {
                       replace_all(tokens[i], m.replacement, " ");
                       if (i == 0 && m.strip_first_space && tokens[i].starts_with(' '))
                         tokens[i].erase(0, 1);
                     }
                   },
               },
               step);
  }
  return join(tokens);
}

}  // namespace sluice::tok
