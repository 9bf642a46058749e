#include "io/gguf_vocab.h"

#include "core/error.h"
#include "io/gguf.h"

namespace sluice {

namespace {

// The array `key` of elements of GGUF type `want`, each converted by `get`; empty when absent.
template <class T>
std::vector<T> read_array(const GgufFile& g, const std::string& key, GgufType want) {
  const GgufValue* v = g.find(key);
  if (!v) return {};
  if (v->type != GgufType::kArray)
    fail("{}: key '{}': expected an array, got GGUF type {}", g.path().string(), key,
         gguf_type_name(v->type));
  if (v->element != want)
    fail("{}: key '{}': expected array elements of GGUF type {}, got {}", g.path().string(), key,
         gguf_type_name(want), gguf_type_name(v->element));
  std::vector<T> out;
  out.reserve(v->value.size());
  for (const auto& e : v->value) out.push_back(e.get<T>());
  return out;
}

int32_t token_id(const GgufFile& g, const std::string& key) {
  const auto id = g.integer(key);
  return id ? static_cast<int32_t>(*id) : -1;
}

}  // namespace

GgufVocab read_gguf_vocab(const std::filesystem::path& path) {
  return read_gguf_vocab(GgufFile::open(path));
}

GgufVocab read_gguf_vocab(const GgufFile& g) {
  const std::string where = g.path().string();
  GgufVocab v;
  v.model = g.string("tokenizer.ggml.model").value_or("");
  v.pre = g.string("tokenizer.ggml.pre").value_or("");
  v.chat_template = g.string("tokenizer.chat_template").value_or("");
  v.tokens = read_array<std::string>(g, "tokenizer.ggml.tokens", GgufType::kString);
  v.merges = read_array<std::string>(g, "tokenizer.ggml.merges", GgufType::kString);
  v.scores = read_array<float>(g, "tokenizer.ggml.scores", GgufType::kF32);
  v.token_types = read_array<int32_t>(g, "tokenizer.ggml.token_type", GgufType::kI32);
  v.bos_id = token_id(g, "tokenizer.ggml.bos_token_id");
  v.eos_id = token_id(g, "tokenizer.ggml.eos_token_id");
  v.unk_id = token_id(g, "tokenizer.ggml.unknown_token_id");
  v.add_bos = g.boolean("tokenizer.ggml.add_bos_token");
  v.add_eos = g.boolean("tokenizer.ggml.add_eos_token");
  v.add_space_prefix = g.boolean("tokenizer.ggml.add_space_prefix");

  if (v.tokens.empty())
    fail("{}: key 'tokenizer.ggml.tokens': missing; this GGUF file has no vocabulary", where);
  const auto n = v.tokens.size();
  if (!v.scores.empty() && v.scores.size() != n)
    fail("{}: key 'tokenizer.ggml.scores': expected {} entries, got {}", where, n, v.scores.size());
  if (!v.token_types.empty() && v.token_types.size() != n)
    fail("{}: key 'tokenizer.ggml.token_type': expected {} entries, got {}", where, n,
         v.token_types.size());
  for (int32_t id : {v.bos_id, v.eos_id, v.unk_id})
    if (id >= static_cast<int64_t>(n))
      fail("{}: special token id {} is outside the vocabulary of {} tokens", where, id, n);
  return v;
}

}  // namespace sluice
