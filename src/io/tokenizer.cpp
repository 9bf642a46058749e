#include "io/tokenizer.h"

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "io/tokenizer/loaders.h"
#include "io/tokenizer/text_util.h"

namespace sluice {

namespace {

namespace fs = std::filesystem;
using namespace tok;

// tokenizer_config.json decides BOS/EOS and may add tokens that tokenizer.json lacks.
void apply_config(BpeTokenizerParts& parts, const TokenizerConfig& config) {
  for (const AddedToken& a : config.added) {
    const bool known = std::any_of(parts.added.begin(), parts.added.end(),
                                   [&](const AddedToken& b) { return b.id == a.id; });
    if (!known) parts.added.push_back(a);
  }
  auto id_of = [&](const std::string& text) -> int32_t {
    for (const auto& a : parts.added)
      if (a.content == text) return a.id;
    return parts.model.find(text);
  };
  // As transformers' Llama/Mistral fast tokenizers: add_bos_token / add_eos_token rebuild the
  // template.
  if (config.add_bos && !config.bos_token.empty()) {
    const int32_t bos = id_of(config.bos_token);
    std::erase(parts.prefix_ids, bos);
    if (*config.add_bos && bos >= 0) parts.prefix_ids.insert(parts.prefix_ids.begin(), bos);
  }
  if (config.add_eos && !config.eos_token.empty()) {
    const int32_t eos = id_of(config.eos_token);
    std::erase(parts.suffix_ids, eos);
    if (*config.add_eos && eos >= 0) parts.suffix_ids.push_back(eos);
  }
}

}  // namespace

std::unique_ptr<Tokenizer> tok::build_tokenizer(BpeTokenizerParts parts,
                                                const TokenizerConfig* config) {
  if (config) apply_config(parts, *config);
  auto t = std::make_unique<BpeTokenizer>(std::move(parts));
  if (config) {
    if (!config->bos_token.empty()) t->set_bos_id(t->token_id(config->bos_token));
    if (!config->eos_token.empty()) t->set_eos_id(t->token_id(config->eos_token));
    t->set_chat_template(config->chat_template);
  }
  return t;
}

namespace {

// Without tokenizer_config.json: BOS is what the template puts first; EOS is the first of the
// usual end-of-text spellings present in the vocabulary.
void guess_bos_eos(Tokenizer& t, const std::vector<int32_t>& prefix_ids) {
  if (t.bos_id() < 0 && !prefix_ids.empty()) t.set_bos_id(prefix_ids.front());
  if (t.eos_id() >= 0) return;
  for (const char* name : {"</s>", "<|endoftext|>", "<|end_of_text|>",
                           "<\xEF\xBD\x9C"
                           "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"}) {
    if (int32_t id = t.token_id(name); id >= 0) {
      t.set_eos_id(id);
      return;
    }
  }
}

bool starts_with_bytes(const fs::path& path, std::string_view prefix) {
  std::ifstream in(path, std::ios::binary);
  std::string head(prefix.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  return in && head == prefix;
}

std::unique_ptr<Tokenizer> load_file(const fs::path& path, const TokenizerConfig* config) {
  const std::string name = path.filename().string();
  const std::string ext = path.extension().string();
  if (ext == ".gguf" || starts_with_bytes(path, "GGUF")) {
    int32_t bos, eos;
    std::string chat_template;
    auto parts = read_gguf_vocab(path, &bos, &eos, &chat_template);
    auto t = build_tokenizer(std::move(parts), config);
    if (t->bos_id() < 0) t->set_bos_id(bos);
    if (t->eos_id() < 0) t->set_eos_id(eos);
    if (t->chat_template().empty()) t->set_chat_template(chat_template);
    return t;
  }
  if (ext == ".tiktoken") {
    auto parts = read_tiktoken(path);
    auto t = build_tokenizer(std::move(parts), config);
    if (t->eos_id() < 0) t->set_eos_id(t->token_id("<|endoftext|>"));
    return t;
  }
  if (ext == ".json") {
    auto parts = read_tokenizer_json(path);
    const std::vector<int32_t> prefix_ids = parts.prefix_ids;
    auto t = build_tokenizer(std::move(parts), config);
    guess_bos_eos(*t, prefix_ids);
    return t;
  }
  if (ext == ".model" || name.find(".model") != std::string::npos)
    return load_sentencepiece(path, config ? *config : TokenizerConfig{});
  fail(
      "{}: unknown tokenizer file type (expected tokenizer.json, *.model, *.tiktoken, *.gguf or "
      "a model folder)",
      path.string());
}

std::unique_ptr<Tokenizer> load_folder(const fs::path& dir) {
  TokenizerConfig config;
  const fs::path config_path = dir / "tokenizer_config.json";
  const bool has_config = fs::exists(config_path);
  if (has_config) config = read_tokenizer_config(config_path);
  const TokenizerConfig* c = has_config ? &config : nullptr;
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (fs::exists(dir / name)) return load_file(dir / name, c);
  if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    const std::string family = config.tokenizer_class.starts_with("Qwen2") ? "qwen2" : "gpt-2";
    auto parts = read_vocab_and_merges(dir / "vocab.json", dir / "merges.txt", family);
    return build_tokenizer(std::move(parts), c);
  }
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".tiktoken") return load_file(entry.path(), c);
  fail(
      "{}: no tokenizer in this folder (looked for tokenizer.json, tokenizer.model, "
      "vocab.json + merges.txt, *.tiktoken)",
      dir.string());
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
  if (fs::is_directory(path)) return load_folder(path);
  if (!fs::exists(path)) fail("{}: no such file or folder", path.string());
  return load_file(path, nullptr);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return utf8_lossy(decode_bytes(ids, skip_special_tokens));
}

std::string StreamingDecoder::push(int32_t id) {
  window_.push_back(id);
  const std::string bytes = tokenizer_.decode_bytes(window_, skip_special_);
  if (bytes.size() > window_bytes_) pending_.append(bytes, window_bytes_);
  window_bytes_ = bytes.size();

  std::string out;
  if (tok::ends_with_incomplete_utf8(pending_)) {
    // Keep the unfinished character (at most 3 bytes) for the next token.
    size_t keep = 1;
    while (keep < pending_.size() && keep < 3 &&
           (static_cast<unsigned char>(pending_[pending_.size() - keep]) & 0xC0) == 0x80)
      ++keep;
    out = tok::utf8_lossy(std::string_view(pending_).substr(0, pending_.size() - keep));
    pending_.erase(0, pending_.size() - keep);
  } else {
    out = tok::utf8_lossy(pending_);
    pending_.clear();
  }
  // Decoders only look at their neighbours (a leading space, byte runs), so once nothing is
  // pending the window can restart at the last token; this keeps push() O(1) per token.
  if (pending_.empty() && window_.size() > 4) {
    window_ = {window_.back()};
    window_bytes_ = tokenizer_.decode_bytes(window_, skip_special_).size();
  }
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out = tok::utf8_lossy(pending_);
  pending_.clear();
  window_.clear();
  window_bytes_ = 0;
  return out;
}

}  // namespace sluice
