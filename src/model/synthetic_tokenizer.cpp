// The tokenizer written next to synthetic checkpoints: byte-level BPE whose merges are learned
// here, deterministically, from a short built-in English text, so generated text exercises real
// merges; with the special tokens, pre-tokenizer and chat template of the model's family
// (FamilySpec::tokenizer).
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/tokenizer/loaders.h"
#include "io/tokenizer/text_util.h"
#include "model/family.h"
#include "model/synthetic.h"

namespace sluice {

namespace {

constexpr const char* kTrainingText =
    "The quick brown fox jumps over the lazy dog. A mixture of experts routes each token to a "
    "few of many feed forward networks, so the model is large but each token touches only a "
    "small part of it. When the weights do not fit in the memory of the machine, they are kept "
    "in a slower tier and brought in just before they are needed, while the processor works on "
    "the previous pages. Throughput is what matters for offline jobs: the number of tokens the "
    "machine can produce in an hour, over thousands of prompts. The attention of each sequence "
    "reads its own cache of keys and values, while the experts are shared by every sequence in "
    "the batch. There is a time to read and a time to compute, and the best schedule keeps both "
    "busy. Hello world! Here is a question: what is the answer? It is forty two, of course.";

using ojson = nlohmann::ordered_json;

// Byte-pair training: the 256 byte symbols at ids [first, first + 256), then merges of the most
// frequent adjacent pair (ties: the smallest pair) until `vocab_size` ids or no pair repeats.
void learn_bpe(int first, int vocab_size, ojson& vocab, nlohmann::json& merges) {
  const auto& symbols = tok::byte_to_unicode();  // GPT-2's byte-level characters
  for (int b = 0; b < 256; ++b) vocab[symbols[b]] = first + b;
  // Words as GPT-2's pre-tokeniser roughly sees them: a leading space stays with the word.
  std::map<std::vector<std::string>, int> words;
  const std::string text = kTrainingText;
  for (size_t i = 0; i < text.size();) {
    size_t j = i + 1;
    while (j < text.size() && text[j] != ' ') ++j;
    std::vector<std::string> word;
    for (size_t k = i; k < j; ++k) word.push_back(symbols[static_cast<unsigned char>(text[k])]);
    ++words[word];
    i = j;
  }
  for (int id = first + 256; id < vocab_size; ++id) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& [word, count] : words)
      for (size_t k = 0; k + 1 < word.size(); ++k) pairs[{word[k], word[k + 1]}] += count;
    auto best = pairs.end();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (best == pairs.end() || it->second > best->second) best = it;
    if (best == pairs.end() || best->second < 2) break;
    auto [a, b] = best->first;
    merges.push_back(a + " " + b);
    vocab[a + b] = id;
    std::map<std::vector<std::string>, int> merged;
    for (const auto& [word, count] : words) {
      std::vector<std::string> w;
      for (size_t k = 0; k < word.size(); ++k) {
        if (k + 1 < word.size() && word[k] == a && word[k + 1] == b) {
          w.push_back(a + b);
          ++k;
        } else {
          w.push_back(word[k]);
        }
      }
      merged[w] += count;
    }
    words = std::move(merged);
  }
}

ojson added_tokens(const TokenizerStyle& style) {
  ojson added = ojson::array();
  for (size_t i = 0; i < style.specials.size(); ++i)
    added.push_back({{"id", i},
                     {"content", style.specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  return added;
}

// GPT-2's ByteLevel with its regex, or the family's Split pattern then ByteLevel without one.
ojson pre_tokenizer(const TokenizerStyle& style) {
  if (!style.split_pattern)
    return {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}};
  const char* pattern = tok::split_pattern_of(style.split_pattern);
  if (!pattern) fail("tokenizer style: no split pattern named '{}'", style.split_pattern);
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", pattern}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", false},
             {"use_regex", false}}}}};
}

// The bos token before every sequence when the family adds one.
ojson post_processor(const TokenizerStyle& style) {
  if (!style.add_bos || style.bos < 0) return nullptr;
  const std::string bos = style.specials[size_t(style.bos)];
  return {{"type", "TemplateProcessing"},
          {"single",
           {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair",
           {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
          {"special_tokens", {{bos, {{"id", bos}, {"ids", {style.bos}}, {"tokens", {bos}}}}}}};
}

ojson token_or_null(const TokenizerStyle& style, int index) {
  return index >= 0 ? ojson(style.specials[size_t(index)]) : ojson(nullptr);
}

}  // namespace

void write_synthetic_tokenizer(const ModelConfig& config, const std::filesystem::path& dir) {
  const TokenizerStyle& style = family_spec(config.family).tokenizer;
  const int first = int(style.specials.size());
  if (config.vocab_size < first + 256)
    fail("vocab_size {} is too small for the byte-level tokenizer (needs at least {})",
         config.vocab_size, first + 256);
  ojson vocab = ojson::object();
  for (int i = 0; i < first; ++i) vocab[style.specials[size_t(i)]] = i;
  nlohmann::json merges = nlohmann::json::array();
  learn_bpe(first, config.vocab_size, vocab, merges);
  const ojson byte_level_decoder = {{"type", "ByteLevel"},
                                    {"add_prefix_space", false},
                                    {"trim_offsets", true},
                                    {"use_regex", true}};
  ojson tokenizer = {{"version", "1.0"},
                     {"truncation", nullptr},
                     {"padding", nullptr},
                     {"added_tokens", added_tokens(style)},
                     {"normalizer", style.nfc ? ojson{{"type", "NFC"}} : ojson(nullptr)},
                     {"pre_tokenizer", pre_tokenizer(style)},
                     {"post_processor", post_processor(style)},
                     {"decoder", byte_level_decoder},
                     {"model",
                      {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", nullptr},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", false},
                       {"byte_fallback", false},
                       {"ignore_merges", false},
                       {"vocab", vocab},
                       {"merges", merges}}}};
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump(1) << "\n";

  ojson tokenizer_config = {{"add_bos_token", style.add_bos},
                            {"add_eos_token", false},
                            {"bos_token", token_or_null(style, style.bos)},
                            {"eos_token", token_or_null(style, style.eos)},
                            {"unk_token", token_or_null(style, style.unk)},
                            {"model_max_length", config.max_position_embeddings},
                            {"tokenizer_class", "PreTrainedTokenizerFast"},
                            {"chat_template", style.chat_template}};
  std::ofstream(dir / "tokenizer_config.json") << tokenizer_config.dump(2) << "\n";
  ojson generation = {
      {"bos_token_id", config.bos_token_id >= 0 ? ojson(config.bos_token_id) : ojson(nullptr)},
      {"eos_token_id", config.eos_token_ids},
      {"do_sample", false}};
  std::ofstream(dir / "generation_config.json") << generation.dump(2) << "\n";
  if (!std::filesystem::exists(dir / "tokenizer.json")) fail("{}: write failed", dir.string());
}

}  // namespace sluice
