// The text stages around the BPE model, as in the Hugging Face `tokenizers` schema:
// normalizers (text -> text), pre-tokenizers (text -> pieces) and decoders (tokens -> text).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "io/tokenizer/regex.h"

namespace sluice::tok {

// ---- normalizers
struct Prepend {
  std::string text;
};  // only onto non-empty text
struct Replace {
  std::string from, to;
};
struct Nfc {};
using NormalizerStep = std::variant<Prepend, Replace, Nfc>;

std::string normalize(const std::vector<NormalizerStep>& steps, std::string text,
                      std::string_view where);

// ---- pre-tokenizers
struct Piece {
  std::string text;
  bool at_start;  // begins the input (Metaspace's "first" prepend scheme looks at this)
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
struct Split {
  std::shared_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};
struct ByteLevel {
  bool add_prefix_space = false;
  bool use_regex = true;  // split with the GPT-2 pattern first
};
enum class PrependScheme { kAlways, kFirst, kNever };
struct Metaspace {
  std::string replacement = "\xE2\x96\x81";  // U+2581
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = true;
};
struct Digits {
  bool individual = false;
};
using PreTokenizerStep = std::variant<Split, ByteLevel, Metaspace, Digits>;

// The GPT-2 pre-tokenizer pattern (used by ByteLevel with use_regex).
extern const char* const kGpt2Pattern;

std::vector<Piece> pre_tokenize(const std::vector<PreTokenizerStep>& steps,
                                std::vector<Piece> pieces);

// ---- decoders
struct ByteLevelDecoder {};
struct ReplaceDecoder {
  std::string from, to;
};
struct ByteFallbackDecoder {};
struct FuseDecoder {};
struct StripDecoder {
  std::string content;
  int start = 0, stop = 0;
};
struct MetaspaceDecoder {
  std::string replacement = "\xE2\x96\x81";
  bool strip_first_space = true;
};
using DecoderStep = std::variant<ByteLevelDecoder, ReplaceDecoder, ByteFallbackDecoder, FuseDecoder,
                                 StripDecoder, MetaspaceDecoder>;

// Decodes token texts to bytes (not necessarily valid UTF-8: byte tokens may split characters).
std::string decode_tokens(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens);

}  // namespace sluice::tok
