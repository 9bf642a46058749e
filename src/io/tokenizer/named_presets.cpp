// Split patterns of well-known byte-level BPE families. GGUF files and tiktoken rank files name
// their family but do not carry the pattern, so it comes from this table. The patterns are those
// of each family's published tokenizer.json (for DeepSeek and Falcon, the sequence of split
// patterns as llama.cpp's llama-vocab.cpp writes them; source files are UTF-8, which reproduces their pre-tokenizers).
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

const std::vector<const char*>& deepseek_llm_patterns() {
  static const std::vector<const char*> p = {
      "[\r\n]",
      "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
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
    s.regex = std::make_shared<Regex>(pattern,
                                      std::string(where) + ": pre-tokenizer pattern");
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
               {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+",
                "\\p{N}"},
               where);
  } else if (name == "deepseek-v3") {
    add_splits(preset,
               {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
                R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
               where);
  } else if (name == "falcon") {
    add_splits(preset, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2NoTrailingPattern, "[0-9][0-9][0-9]"}, where);
  } else if (name == "starcoder" || name == "refact") {
    add_splits(preset, {"\\p{N}", kGpt2NoTrailingPattern}, where);
  } else {
    fail("{}: pre-tokenizer '{}' is not known (known: gpt-2, mpt, olmo, gpt-neox, llama-bpe, "
         "dbrx, qwen2, deepseek-llm, deepseek-coder, deepseek-v3, falcon, starcoder, refact)",
         where, name);
  }
  return preset;
}

std::vector<DecoderStep> byte_level_decoders() { return {ByteLevelDecoder{}}; }

}  // namespace sluice::tok
