// A tokenizer assembled from parts: added tokens, normalizers, pre-tokenizers, a BPE model,
// BOS/EOS template and decoders. The tokenizer.json, GGUF and tiktoken loaders all build one.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "io/tokenizer/bpe_model.h"
#include "io/tokenizer/pipeline.h"

namespace sluice::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;      // skipped by decode(skip_special_tokens=true)
  bool normalized = false;   // matched in the normalized text rather than the raw text
  bool lstrip = false;       // swallows whitespace on its left
  bool rstrip = false;       // swallows whitespace on its right
  bool single_word = false;  // only matches when not inside a word
};

struct BpeTokenizerParts {
  std::string source;  // file the tokenizer came from, for error messages
  BpeModel model;
  std::vector<AddedToken> added;
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  std::vector<DecoderStep> decoders;
  std::vector<int32_t> prefix_ids;  // added around the text when add_special_tokens
  std::vector<int32_t> suffix_ids;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeTokenizerParts parts);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const override;
  std::string decode_bytes(std::span<const int32_t> ids,
                           bool skip_special_tokens = false) const override;
  int vocab_size() const override { return vocab_size_; }
  std::string token_text(int32_t id) const override;
  int32_t token_id(std::string_view text) const override;

 private:
  struct Segment {
    std::string text;
    int32_t added_id;  // -1 for ordinary text
    size_t begin;      // byte offset in the raw input (for "starts the input")
  };
  // Splits ordinary-text segments around matches of the added tokens with normalized == which.
  std::vector<Segment> split_added(std::vector<Segment> segments, bool which) const;

  const std::string& model_token(int32_t id) const {
    static const std::string none;
    return static_cast<size_t>(id) < p_.model.id_to_token.size() ? p_.model.id_to_token[id] : none;
  }

  BpeTokenizerParts p_;
  std::array<bool, 256> added_first_bytes_{};   // first bytes of added tokens, to skip fast
  std::vector<const AddedToken*> added_by_id_;  // indexed by id, null when not an added token
  int vocab_size_ = 0;
};

}  // namespace sluice::tok
