// Split patterns of well-known byte-level BPE families. GGUF files and tiktoken rank files name
// their family but do not carry the pattern, so it comes from this table. The patterns are those
// of each family's published tokenizer.json (for DeepSeek and Falcon, the sequence of split
// patterns as llama.cpp's llama-vocab.cpp writes them; source files are UTF-8, which reproduces
// their pre-tokenizers).
#include "core/error.h"
#include "io/tokenizer/loaders.h"

namespace sluice::tok {

namespace {

// GPT-4's cl100k_base, also Llama-3 and DBRX.
constexpr const char* kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen (all generations): as cl100k but digits one at a time.
constexpr const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt2NoTrailingPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// Written with \x{...} escapes: several of these letters (e.g. U+1F7D, U+212A) change under
// Unicode normalization, which editors and copy-paste may apply silently.
const std::vector<const char*>& deepseek_llm_patterns() {
  static const std::vector<const char*> p = {
      "[\r\n]",
      "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-"
      "\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}"
      "\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{"
      "52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{"
      "1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-"
      "\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{"
      "1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}"
      "\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{"
      "1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"
      "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{"
      "2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"
      "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{"
      "A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-"
      "\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{"
      "104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-"
      "\\x{118DF}\\x{1E900}-\\x{1E943}]+",
      "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
      "\\s+$",
      "[一-龥ࠀ-一가-퟿]+",
      "\\p{N}+",
  };
  return p;
}

void add_splits(NamedPreset& preset, const std::vector<const char*>& patterns,
                std::string_view where) {
  for (const char* pattern : patterns) {
    Split s;
    s.regex = std::make_shared<Regex>(pattern, std::string(where) + ": pre-tokenizer pattern");
    preset.pre_tokenizers.push_back(std::move(s));
  }
  preset.pre_tokenizers.push_back(ByteLevel{false, false});
}

}  // namespace

NamedPreset named_preset(std::string_view name, std::string_view where) {
  NamedPreset preset;
  if (name == "gpt-2" || name == "gpt2") {
    preset.pre_tokenizers.push_back(ByteLevel{false, true});
  } else if (name == "mpt" || name == "olmo" || name == "gpt-neox") {
    preset.normalizers.push_back(Nfc{});
    preset.pre_tokenizers.push_back(ByteLevel{false, true});
  } else if (name == "llama-bpe" || name == "llama3" || name == "dbrx" || name == "cl100k") {
    add_splits(preset, {kCl100kPattern}, where);
  } else if (name == "qwen2" || name == "qwen") {
    preset.normalizers.push_back(Nfc{});
    add_splits(preset, {kQwenPattern}, where);
  } else if (name == "deepseek-llm") {
    add_splits(preset, deepseek_llm_patterns(), where);
  } else if (name == "deepseek-coder") {
    add_splits(preset,
               {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"},
               where);
  } else if (name == "deepseek-v3") {
    add_splits(
        preset,
        {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
         R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
        where);
  } else if (name == "falcon") {
    add_splits(preset, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2NoTrailingPattern, "[0-9][0-9][0-9]"},
               where);
  } else if (name == "starcoder" || name == "refact") {
    add_splits(preset, {"\\p{N}", kGpt2NoTrailingPattern}, where);
  } else {
    fail(
        "{}: pre-tokenizer '{}' is not known (known: gpt-2, mpt, olmo, gpt-neox, llama-bpe, "
        "dbrx, qwen2, deepseek-llm, deepseek-coder, deepseek-v3, falcon, starcoder, refact)",
        where, name);
  }
  return preset;
}

const char* split_pattern_of(std::string_view name) {
  if (name == "llama-bpe" || name == "llama3" || name == "dbrx" || name == "cl100k")
    return kCl100kPattern;
  if (name == "qwen2" || name == "qwen") return kQwenPattern;
  return nullptr;
}

std::vector<DecoderStep> byte_level_decoders() {
  return {ByteLevelDecoder{}};
}

}  // namespace sluice::tok
