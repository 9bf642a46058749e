// SentencePiece models (tokenizer.model) through libsentencepiece.
#include <sentencepiece_processor.h>

#include "core/error.h"
#include "io/tokenizer/loaders.h"
#include "io/tokenizer/text_util.h"

namespace sluice::tok {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const fs::path& path, const TokenizerConfig& config)
      : source_(path.string()) {
    const auto status = sp_.Load(path.string());
    if (!status.ok()) fail("{}: not a SentencePiece model: {}", source_, status.ToString());
    add_bos_ = config.add_bos.value_or(true);
    add_eos_ = config.add_eos.value_or(false);
    set_bos_id(config.bos_token.empty() ? sp_.bos_id() : sp_.PieceToId(config.bos_token));
    set_eos_id(config.eos_token.empty() ? sp_.eos_id() : sp_.PieceToId(config.eos_token));
    set_chat_template(config.chat_template);
    // Control pieces written in the text (e.g. "[INST]") are recognised as tokens; SentencePiece
    // itself would spell them out letter by letter.
    for (int id = 0; id < sp_.GetPieceSize(); ++id)
      if (sp_.IsControl(id) && !sp_.IdToPiece(id).empty())
        specials_.emplace_back(sp_.IdToPiece(id), id);
    for (const AddedToken& a : config.added)
      if (a.special && a.id < sp_.GetPieceSize()) specials_.emplace_back(a.content, a.id);
  }

  std::vector<int32_t> encode(std::string_view raw, bool add_special_tokens) const override {
    const std::string text = utf8_lossy(raw);
    std::vector<int32_t> ids;
    if (add_special_tokens && add_bos_ && bos_id() >= 0) ids.push_back(bos_id());
    size_t plain = 0, i = 0;
    auto flush_plain = [&](size_t end) {
      if (end <= plain) return;
      std::vector<int> part;
      const auto status = sp_.Encode(std::string_view(text).substr(plain, end - plain), &part);
      if (!status.ok()) fail("{}: SentencePiece encode failed: {}", source_, status.ToString());
      ids.insert(ids.end(), part.begin(), part.end());
    };
    while (i < text.size()) {
      const std::pair<std::string, int32_t>* hit = nullptr;
      for (const auto& s : specials_)
        if (text.compare(i, s.first.size(), s.first) == 0 &&
            (!hit || s.first.size() > hit->first.size()))
          hit = &s;
      if (!hit) {
        ++i;
        continue;
      }
      flush_plain(i);
      ids.push_back(hit->second);
      plain = i = i + hit->first.size();
    }
    flush_plain(text.size());
    if (add_special_tokens && add_eos_ && eos_id() >= 0) ids.push_back(eos_id());
    return ids;
  }

  // Written out rather than sp_.Decode so that byte pieces stay raw bytes (the streaming decoder
  // needs to see incomplete characters) and control tokens can be shown.
  std::string decode_bytes(std::span<const int32_t> ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id >= sp_.GetPieceSize()) continue;  // padding rows of the model: skipped, as in HF
      check(id);
      if (sp_.IsByte(id)) {
        const std::string piece = sp_.IdToPiece(id);  // "<0xAB>"
        out += static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16));
      } else if (sp_.IsControl(id)) {
        if (!skip_special) out += sp_.IdToPiece(id);
      } else {
        const std::string piece = sp_.IdToPiece(id);
        for (size_t p = 0; p < piece.size();) {  // "▁" (U+2581, 3 bytes) stands for a space
          if (piece.compare(p, 3, "\xE2\x96\x81") == 0) {
            out += ' ';
            p += 3;
          } else {
            out += piece[p++];
          }
        }
      }
    }
    if (out.starts_with(' ')) out.erase(0, 1);  // the dummy prefix SentencePiece added
    return out;
  }

  int vocab_size() const override { return sp_.GetPieceSize(); }
  std::string token_text(int32_t id) const override {
    check(id);
    return sp_.IdToPiece(id);
  }
  int32_t token_id(std::string_view text) const override {
    const int id = sp_.PieceToId(text);
    return id == sp_.unk_id() && text != sp_.IdToPiece(id) ? -1 : id;
  }

 private:
  void check(int32_t id) const {
    if (id < 0 || id >= sp_.GetPieceSize())
      fail("{}: token id {} is outside the vocabulary [0, {})", source_, id, sp_.GetPieceSize());
  }

  std::string source_;
  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_ = true, add_eos_ = false;
  std::vector<std::pair<std::string, int32_t>> specials_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const fs::path& path, const TokenizerConfig& config) {
  return std::make_unique<SentencePieceTokenizer>(path, config);
}

}  // namespace sluice::tok
