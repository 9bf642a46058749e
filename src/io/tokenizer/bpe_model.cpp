#include "io/tokenizer/bpe_model.h"

#include <fmt/format.h>

#include <queue>

#include "core/error.h"
#include "io/tokenizer/text_util.h"

namespace sluice::tok {

void check_id(int64_t id, size_t entries, const std::string& where, const std::string& field) {
  if (id < 0 || id >= int64_t(entries) + kMaxIdBeyondEntries)
    fail("{}: field '{}': id {} is outside [0, {}) (the vocabulary has {} entries)", where, field,
         id, int64_t(entries) + kMaxIdBeyondEntries, entries);
}

void BpeModel::finish() {
  for (int b = 0; b < 256; ++b) byte_ids[b] = find(fmt::format("<0x{:02X}>", b));
}

namespace {

struct Symbol {
  size_t begin, length;  // bytes of the word this symbol covers
  int32_t id;            // -1 when the text is not a token
  int prev, next;        // neighbours in the linked list, -1 at the ends
};

struct Candidate {
  double priority;  // smaller merges first
  int left, right;
  size_t left_length, right_length;  // to detect candidates made stale by other merges
  int32_t merged_id;
  bool operator>(const Candidate& o) const {
    return priority > o.priority || (priority == o.priority && left > o.left);
  }
};

// The word's characters (UTF-8 sequences), each its token where it is one.
std::vector<Symbol> characters(const BpeModel& m, std::string_view word) {
  std::vector<Symbol> symbols;
  for (size_t i = 0; i < word.size();) {
    size_t n = std::min(utf8_sequence_length(static_cast<unsigned char>(word[i])), word.size() - i);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({i, n, m.find(word.substr(i, n)), index - 1, -1});
    if (index > 0) symbols[index - 1].next = index;
    i += n;
  }
  return symbols;
}

// Merges neighbouring symbols, best first by the model's rule, until no pair merges.
void merge(const BpeModel& m, std::string_view word, std::vector<Symbol>& symbols) {
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = symbols[left];
    const Symbol& b = symbols[right];
    double priority;
    int32_t merged;
    if (m.rule == MergeRule::kMergeList) {
      if (a.id < 0 || b.id < 0) return;
      auto it = m.merge_ranks.find(static_cast<uint64_t>(a.id) << 32 | static_cast<uint32_t>(b.id));
      if (it == m.merge_ranks.end()) return;
      merged = m.find(word.substr(a.begin, a.length + b.length));
      if (merged < 0) return;
      priority = it->second;
    } else {
      merged = m.find(word.substr(a.begin, a.length + b.length));
      if (merged < 0) return;
      priority = m.rule == MergeRule::kVocabScore ? -static_cast<double>(m.scores[merged]) : merged;
    }
    queue.push({priority, left, right, a.length, b.length, merged});
  };
  for (size_t i = 1; i < symbols.size(); ++i)
    consider(static_cast<int>(i) - 1, static_cast<int>(i));

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& a = symbols[c.left];
    Symbol& b = symbols[c.right];
    if (a.length != c.left_length || b.length != c.right_length || a.next != c.right) continue;
    a.length += b.length;
    a.id = c.merged_id;
    a.next = b.next;
    if (b.next >= 0) symbols[b.next].prev = c.left;
    b.length = 0;  // marks b as merged away
    consider(a.prev, c.left);
    consider(c.left, a.next);
  }
}

// The ids of the merged symbols; a symbol that is no token as its bytes' tokens (byte fallback)
// or <unk> (consecutive ones fused where the model says).
void emit(const BpeModel& m, std::string_view word, const std::vector<Symbol>& symbols,
          std::vector<int32_t>& out) {
  bool last_was_unk = false;
  for (int i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      last_was_unk = false;
      continue;
    }
    const std::string_view text = word.substr(s.begin, s.length);
    bool all_bytes = m.byte_fallback;
    for (unsigned char c : text) all_bytes = all_bytes && m.byte_ids[c] >= 0;
    if (all_bytes) {
      for (unsigned char c : text) out.push_back(m.byte_ids[c]);
      last_was_unk = false;
    } else if (m.unk_id >= 0) {
      if (!(m.fuse_unk && last_was_unk)) out.push_back(m.unk_id);
      last_was_unk = true;
    }
    // Without byte fallback or <unk> the piece has no id; the reference tokenizers drop it too.
  }
}

}  // namespace

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (int32_t id = find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol> symbols = characters(*this, word);
  merge(*this, word, symbols);
  emit(*this, word, symbols, out);
}

}  // namespace sluice::tok
