// The readers of each tokenizer file format. Tokenizer::load picks one by file name.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/tokenizer/bpe_tokenizer.h"

namespace sluice::tok {

namespace fs = std::filesystem;

// What tokenizer_config.json adds to the vocabulary files.
struct TokenizerConfig {
  std::optional<bool> add_bos, add_eos;
  std::string bos_token, eos_token;  // token texts; empty when not given
  std::string chat_template;
  std::string tokenizer_class;
  std::vector<AddedToken> added;  // from added_tokens_decoder
};
TokenizerConfig read_tokenizer_config(const fs::path& path);

// The tokenizer made of `parts`, with tokenizer_config.json's BOS/EOS choices and extra added
// tokens applied when `config` is given.
std::unique_ptr<Tokenizer> build_tokenizer(BpeTokenizerParts parts, const TokenizerConfig* config);

// Hugging Face tokenizer.json.
BpeTokenizerParts read_tokenizer_json(const fs::path& path);
// GPT-2 style vocab.json + merges.txt; `pre_tokenizer` names the split pattern (see
// named_pre_tokenizer).
BpeTokenizerParts read_vocab_and_merges(const fs::path& vocab_json, const fs::path& merges_txt,
                                        std::string_view pre_tokenizer);
// tiktoken rank file; the split pattern and special tokens come from a table of known files.
BpeTokenizerParts read_tiktoken(const fs::path& path);
// The vocabulary in a GGUF file's metadata (tokenizer.ggml.*).
BpeTokenizerParts read_gguf_vocab(const fs::path& path, int32_t* bos_id, int32_t* eos_id,
                                  std::string* chat_template);
// SentencePiece model through libsentencepiece.
std::unique_ptr<Tokenizer> load_sentencepiece(const fs::path& path, const TokenizerConfig& config);

// Normalizers and byte-level pre-tokenizer of a well-known family, by the names llama.cpp uses in
// tokenizer.ggml.pre ("gpt-2", "llama-bpe", "qwen2", "deepseek-llm", ...); `where` names the file.
struct NamedPreset {
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
};
NamedPreset named_preset(std::string_view name, std::string_view where);
// The split regex of a named byte-level family with a single pattern ("qwen2", "cl100k", "dbrx",
// "llama3"), as its tokenizer.json writes it; null for other names.
const char* split_pattern_of(std::string_view name);
// The standard byte-level decoder chain.
std::vector<DecoderStep> byte_level_decoders();

}  // namespace sluice::tok
