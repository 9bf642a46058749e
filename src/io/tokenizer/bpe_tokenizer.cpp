#include "io/tokenizer/bpe_tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "io/tokenizer/text_util.h"

namespace sluice::tok {

BpeTokenizer::BpeTokenizer(BpeTokenizerParts parts) : p_(std::move(parts)) {
  vocab_size_ = static_cast<int>(p_.model.id_to_token.size());
  for (const auto& a : p_.added) {
    check_id(a.id, p_.model.id_to_token.size() + p_.added.size(), p_.source,
             "added token '" + a.content + "'");
    vocab_size_ = std::max(vocab_size_, a.id + 1);
  }
  // Longest first, so that the first token that matches at a position is the longest match.
  std::stable_sort(p_.added.begin(), p_.added.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  added_by_id_.assign(vocab_size_, nullptr);
  for (const auto& a : p_.added) {
    added_by_id_[a.id] = &a;
    if (!a.content.empty()) added_first_bytes_[static_cast<unsigned char>(a.content[0])] = true;
  }
}

namespace {

bool is_space(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}
bool is_word_char(unsigned char c) {
  return std::isalnum(c) || c == '_' || c >= 0x80;
}

}  // namespace

std::vector<BpeTokenizer::Segment> BpeTokenizer::split_added(std::vector<Segment> segments,
                                                             bool which) const {
  std::vector<Segment> out;
  for (Segment& seg : segments) {
    if (seg.added_id >= 0) {
      out.push_back(std::move(seg));
      continue;
    }
    const std::string& t = seg.text;
    size_t plain_begin = 0;  // start of the ordinary text not yet emitted
    size_t i = 0;
    while (i < t.size()) {
      if (!added_first_bytes_[static_cast<unsigned char>(t[i])]) {
        ++i;
        continue;
      }
      const AddedToken* hit = nullptr;
      for (const auto& a : p_.added) {
        if (a.normalized != which || a.content.empty()) continue;
        if (t.compare(i, a.content.size(), a.content) != 0) continue;
        if (a.single_word) {
          const bool left_ok = i == 0 || !is_word_char(t[i - 1]);
          const size_t e = i + a.content.size();
          const bool right_ok = e >= t.size() || !is_word_char(t[e]);
          if (!left_ok || !right_ok) continue;
        }
        hit = &a;
        break;
      }
      if (!hit) {
        ++i;
        continue;
      }
      size_t match_begin = i, match_end = i + hit->content.size();
      if (hit->lstrip)
        while (match_begin > plain_begin && is_space(t[match_begin - 1])) --match_begin;
      if (hit->rstrip)
        while (match_end < t.size() && is_space(t[match_end])) ++match_end;
      if (match_begin > plain_begin)
        out.push_back(
            {t.substr(plain_begin, match_begin - plain_begin), -1, seg.begin + plain_begin});
      out.push_back({hit->content, hit->id, seg.begin + match_begin});
      plain_begin = i = match_end;
    }
    if (plain_begin < t.size()) out.push_back({t.substr(plain_begin), -1, seg.begin + plain_begin});
  }
  return out;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = p_.prefix_ids;
  // The reference tokenizers take Unicode strings; raw bytes that are not UTF-8 become U+FFFD.
  std::vector<Segment> segments{{utf8_lossy(text), -1, 0}};
  segments = split_added(std::move(segments), false);
  for (Segment& s : segments)
    if (s.added_id < 0) s.text = normalize(p_.normalizers, std::move(s.text), p_.source);
  segments = split_added(std::move(segments), true);
  for (const Segment& s : segments) {
    if (s.added_id >= 0) {
      ids.push_back(s.added_id);
      continue;
    }
    for (const Piece& piece : pre_tokenize(p_.pre_tokenizers, {{s.text, s.begin == 0}}))
      p_.model.encode_word(piece.text, ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), p_.suffix_ids.begin(), p_.suffix_ids.end());
  return ids;
}

std::string BpeTokenizer::decode_bytes(std::span<const int32_t> ids,
                                       bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0) fail("{}: token id {} is negative", p_.source, id);
    // Models often have more embedding rows than the tokenizer has tokens; like the reference
    // tokenizers library, decoding skips ids the vocabulary does not have.
    if (id >= vocab_size_) continue;
    if (const AddedToken* a = added_by_id_[id]) {
      if (!(skip_special_tokens && a->special)) tokens.push_back(a->content);
    } else {
      tokens.push_back(model_token(id));
    }
  }
  return decode_tokens(p_.decoders, std::move(tokens));
}

std::string BpeTokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size_)
    fail("{}: token id {} is outside the vocabulary [0, {})", p_.source, id, vocab_size_);
  if (const AddedToken* a = added_by_id_[id]) return a->content;
  return model_token(id);
}

int32_t BpeTokenizer::token_id(std::string_view text) const {
  for (const auto& a : p_.added)
    if (a.content == text) return a.id;
  return p_.model.find(text);
}

}  // namespace sluice::tok
