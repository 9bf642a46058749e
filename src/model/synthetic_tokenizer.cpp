// The tokenizer written next to synthetic checkpoints: GPT-2-style byte-level BPE whose merges
// are learned here, deterministically, from a short built-in English text, so generated text
// exercises real merges.
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/tokenizer/text_util.h"
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

}  // namespace

void write_synthetic_tokenizer(const ModelConfig& config, const std::filesystem::path& dir) {
  const std::vector<std::string> specials = {"<unk>", "<s>", "</s>"};
  const int base = int(specials.size()) + 256;
  if (config.vocab_size < base)
    fail("vocab_size {} is too small for the byte-level tokenizer (needs at least {})",
         config.vocab_size, base);
  const auto& symbols = tok::byte_to_unicode();  // GPT-2's byte-level characters

  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t i = 0; i < specials.size(); ++i) vocab[specials[i]] = i;
  for (int b = 0; b < 256; ++b) vocab[symbols[b]] = int(specials.size()) + b;

  // Words as GPT-2's pre-tokeniser roughly sees them: a leading space stays with the word.
  std::map<std::vector<std::string>, int> words;
  std::string text = kTrainingText;
  for (size_t i = 0; i < text.size();) {
    size_t j = i + 1;
    while (j < text.size() && text[j] != ' ') ++j;
    std::vector<std::string> word;
    for (size_t k = i; k < j; ++k) word.push_back(symbols[static_cast<unsigned char>(text[k])]);
    ++words[word];
    i = j;
  }
  // Byte-pair training: repeatedly merge the most frequent adjacent pair (ties: smallest pair).
  nlohmann::json merges = nlohmann::json::array();
  for (int id = base; id < config.vocab_size; ++id) {
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

  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (size_t i = 0; i < specials.size(); ++i)
    added.push_back({{"id", i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  nlohmann::ordered_json byte_level = {{"type", "ByteLevel"},
                                       {"add_prefix_space", false},
                                       {"trim_offsets", true},
                                       {"use_regex", true}};
  nlohmann::ordered_json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", byte_level},
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

  nlohmann::ordered_json tokenizer_config = {
      {"add_bos_token", true},
      {"add_eos_token", false},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"},
      {"unk_token", "<unk>"},
      {"model_max_length", config.max_position_embeddings},
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"chat_template",
       "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
       "{{ message['content'] + '\\n\\n' }}{% elif message['role'] == 'user' %}"
       "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
       "{{ message['content'] + eos_token }}{% endif %}{% endfor %}"}};
  std::ofstream(dir / "tokenizer_config.json") << tokenizer_config.dump(2) << "\n";
  nlohmann::ordered_json generation = {{"bos_token_id", config.bos_token_id},
                                       {"eos_token_id", config.eos_token_ids},
                                       {"do_sample", false}};
  std::ofstream(dir / "generation_config.json") << generation.dump(2) << "\n";
  if (!std::filesystem::exists(dir / "tokenizer.json")) fail("{}: write failed", dir.string());
}

}  // namespace sluice
