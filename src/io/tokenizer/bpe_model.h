// Byte-pair encoding of one pre-token: start from characters, repeatedly merge the adjacent pair
// with the best priority, map what is left to ids (byte fallback or <unk> for unknown pieces).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sluice::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// How the priority of merging two adjacent pieces is decided.
enum class MergeRule {
  kMergeList,   // Hugging Face / GPT-2: the pair's position in an explicit merge list
  kVocabScore,  // SentencePiece BPE: the merged piece must be in the vocabulary; highest score
  kVocabRank,   // tiktoken: the merged piece must be in the vocabulary; lowest rank (= id)
};

// Ids index tables, so an id further than this beyond a vocabulary's entries is refused rather
// than allocated (real vocabularies number their tokens 0..n-1 and their added tokens just after).
inline constexpr int64_t kMaxIdBeyondEntries = int64_t(1) << 20;

// Fails naming `where` and `field` unless 0 <= id < entries + kMaxIdBeyondEntries.
void check_id(int64_t id, size_t entries, const std::string& where, const std::string& field);

struct BpeModel {
  std::vector<std::string> id_to_token;  // holes (ids used only by added tokens) are empty
  TokenMap token_to_id;
  MergeRule rule = MergeRule::kMergeList;
  // kMergeList: (left id << 32 | right id) -> rank. The merged id is the vocab id of the
  // concatenation.
  std::unordered_map<uint64_t, int32_t> merge_ranks;
  std::vector<float> scores;   // kVocabScore, by id
  bool byte_fallback = false;  // unknown pieces become <0xXX> tokens
  bool fuse_unk = false;       // consecutive unknown pieces become a single <unk>
  bool ignore_merges = false;  // a pre-token that is itself a token is used as is
  int32_t unk_id = -1;
  std::array<int32_t, 256> byte_ids{};  // id of <0xXX>, -1 when absent (filled by finish())

  // Call after filling the vocabulary.
  void finish();
  int32_t find(std::string_view token) const {
    auto it = token_to_id.find(token);
    return it == token_to_id.end() ? -1 : it->second;
  }
  // `where` names the file for the error raised when a piece cannot be encoded at all.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
};

}  // namespace sluice::tok
