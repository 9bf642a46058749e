// Builds a tokenizer from the vocabulary in a GGUF file.
#include "core/error.h"
#include "io/gguf_vocab.h"
#include "io/tokenizer/loaders.h"

namespace sluice::tok {

namespace {

constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

GgufTokenType type_of(const GgufVocab& v, size_t id) {
  return v.token_types.empty() ? GgufTokenType::kNormal
                               : static_cast<GgufTokenType>(v.token_types[id]);
}

}  // namespace

BpeTokenizerParts read_gguf_vocab(const fs::path& path, int32_t* bos_id, int32_t* eos_id,
                                  std::string* chat_template) {
  const std::string where = path.string();
  const GgufVocab v = sluice::read_gguf_vocab(path);
  BpeTokenizerParts parts;
  parts.source = where;
  BpeModel& m = parts.model;
  m.id_to_token = v.tokens;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const GgufTokenType t = type_of(v, id);
    // An unused id ("[PAD<id>]", where the converter pads the list to the embedding's rows) is a
    // hole, as in the folder's tokenizer: never produced by encoding, decoded as nothing (as
    // llama.cpp decodes it).
    if (t == GgufTokenType::kUnused) {
      m.id_to_token[id].clear();
      continue;
    }
    if (t == GgufTokenType::kControl || t == GgufTokenType::kUserDefined) {
      AddedToken a;
      a.content = v.tokens[id];
      a.id = static_cast<int32_t>(id);
      a.special = t == GgufTokenType::kControl;
      a.normalized = t == GgufTokenType::kUserDefined && v.model == "gpt2";
      parts.added.push_back(std::move(a));
    }
    m.token_to_id.emplace(v.tokens[id], static_cast<int32_t>(id));
  }

  bool add_bos = false;
  if (v.model == "gpt2") {
    m.rule = MergeRule::kMergeList;
    for (size_t rank = 0; rank < v.merges.size(); ++rank) {
      const std::string& s = v.merges[rank];
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos)
        fail("{}: key 'tokenizer.ggml.merges[{}]': expected \"left right\", got \"{}\"", where,
             rank, s);
      const int32_t a = m.find(s.substr(0, space)), b = m.find(s.substr(space + 1));
      if (a < 0 || b < 0)
        fail("{}: key 'tokenizer.ggml.merges[{}]': '{}' uses tokens missing from the vocabulary",
             where, rank, s);
      m.merge_ranks.emplace(static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b),
                            static_cast<int32_t>(rank));
    }
    NamedPreset preset = named_preset(v.pre.empty() ? "gpt-2" : v.pre, where);
    parts.normalizers = std::move(preset.normalizers);
    parts.pre_tokenizers = std::move(preset.pre_tokenizers);
    parts.decoders = byte_level_decoders();
    add_bos = v.add_bos.value_or(false);
    m.finish();
  } else if (v.model == "llama") {
    // SentencePiece BPE: merge whichever adjacent pair forms the highest-scoring vocabulary
    // piece; what stays unknown falls back to <0xXX> byte tokens.
    if (v.scores.empty())
      fail("{}: key 'tokenizer.ggml.scores': missing for a 'llama' vocabulary", where);
    m.rule = MergeRule::kVocabScore;
    m.scores = v.scores;
    m.byte_fallback = true;
    m.unk_id = v.unk_id;
    m.finish();  // finds the <0xXX> ids before they leave token_to_id below
    // Only normal pieces may be produced by merging text.
    for (size_t id = 0; id < v.tokens.size(); ++id)
      if (type_of(v, id) != GgufTokenType::kNormal) m.token_to_id.erase(v.tokens[id]);
    if (v.add_space_prefix.value_or(true)) parts.normalizers.push_back(Prepend{kSpace});
    parts.normalizers.push_back(Replace{" ", kSpace});
    parts.decoders = {ReplaceDecoder{kSpace, " "}, ByteFallbackDecoder{}, FuseDecoder{},
                      StripDecoder{" ", v.add_space_prefix.value_or(true) ? 1 : 0, 0}};
    add_bos = v.add_bos.value_or(true);
  } else {
    fail(
        "{}: key 'tokenizer.ggml.model': unsupported tokenizer model '{}' (supported: llama, gpt2)",
        where, v.model);
  }
  if (add_bos && v.bos_id >= 0) parts.prefix_ids.push_back(v.bos_id);
  if (v.add_eos.value_or(false) && v.eos_id >= 0) parts.suffix_ids.push_back(v.eos_id);
  *bos_id = v.bos_id;
  *eos_id = v.eos_id;
  *chat_template = v.chat_template;
  return parts;
}

}  // namespace sluice::tok
