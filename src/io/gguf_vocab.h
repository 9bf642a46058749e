// Reads the tokenizer metadata (tokenizer.ggml.*) of a GGUF file (io/gguf.h); tensors are not
// touched.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace sluice {

// llama.cpp's token types.
enum class GgufTokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct GgufVocab {
  std::string model;  // tokenizer.ggml.model: "llama" (SentencePiece BPE), "gpt2" (byte-level BPE)
  std::string pre;    // tokenizer.ggml.pre: the pre-tokenizer family, e.g. "llama-bpe"
  std::vector<std::string> tokens;
  std::vector<float> scores;         // empty when absent
  std::vector<int32_t> token_types;  // empty when absent
  std::vector<std::string> merges;   // "left right"; empty when absent
  int32_t bos_id = -1, eos_id = -1, unk_id = -1;
  std::optional<bool> add_bos, add_eos;
  std::optional<bool> add_space_prefix;
  std::string chat_template;
};

class GgufFile;

GgufVocab read_gguf_vocab(const std::filesystem::path& path);
GgufVocab read_gguf_vocab(const GgufFile& file);

}  // namespace sluice
