// Text <-> token ids from a checkpoint's own tokenizer files.
//
// Tokenizer::load accepts a Hugging Face tokenizer.json, a SentencePiece tokenizer.model, a
// tiktoken rank file (*.tiktoken), a GGUF file's vocabulary, or a model folder holding one of these
// (it prefers tokenizer.json, then tokenizer.model, then *.tiktoken, and reads
// tokenizer_config.json when present for add_bos/add_eos, bos/eos tokens and the chat template).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& path);

  // add_special_tokens: add the BOS/EOS the model expects (the post-processor's template).
  // Special tokens written in the text (e.g. "<|im_start|>") are always recognised.
  virtual std::vector<int32_t> encode(std::string_view text,
                                      bool add_special_tokens = true) const = 0;
  // Invalid UTF-8 in the decoded bytes is replaced by U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // The decoded bytes, possibly ending in (or containing) incomplete UTF-8.
  virtual std::string decode_bytes(std::span<const int32_t> ids,
                                   bool skip_special_tokens = false) const = 0;

  virtual int vocab_size() const = 0;
  int32_t bos_id() const { return bos_id_; }  // -1 when none
  int32_t eos_id() const { return eos_id_; }  // -1 when none
  // The chat template from tokenizer_config.json or GGUF metadata; empty when none.
  const std::string& chat_template() const { return chat_template_; }
  // The vocabulary entry of one id, for debugging.
  virtual std::string token_text(int32_t id) const = 0;

  // Used by the loaders.
  void set_bos_id(int32_t id) { bos_id_ = id; }
  void set_eos_id(int32_t id) { eos_id_ = id; }
  void set_chat_template(std::string t) { chat_template_ = std::move(t); }
  virtual int32_t token_id(std::string_view token_text) const = 0;  // -1 when absent

 private:
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  std::string chat_template_;
};

// Streams decoded text token by token, emitting only complete UTF-8 characters.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}
  // The text that token `id` completes; may be empty while a character is incomplete.
  std::string push(int32_t id);
  // Whatever is still pending; an incomplete character becomes U+FFFD.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> window_;  // recent ids, decoded together so decoders see their context
  size_t window_bytes_ = 0;      // bytes of decode_bytes(window_) already taken into pending_
  std::string pending_;          // decoded bytes not yet emitted (an incomplete character)
};

}  // namespace sluice
