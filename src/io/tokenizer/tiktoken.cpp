// Reader of tiktoken rank files: one "<base64 token bytes> <rank>" per line; the rank is the id
// and the merge priority. The file holds neither the split pattern nor the special tokens, so
// they come from a table of well-known files, recognised by file name:
//   cl100k_base.tiktoken (GPT-4, DBRX): cl100k pattern; <|endoftext|> 100257, FIM 100258-100260,
//     <|endofprompt|> 100276.
//   qwen.tiktoken (Qwen 1): Qwen pattern, NFC; <|endoftext|> 151643, <|im_start|> 151644,
//     <|im_end|> 151645, <|extra_0|>..<|extra_204|> 151646-151850.
#include <fstream>

#include "core/error.h"
#include "io/tokenizer/loaders.h"
#include "io/tokenizer/text_util.h"

namespace sluice::tok {

namespace {

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool decode_base64(std::string_view in, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const int v = base64_value(c);
    if (v < 0) return false;
    acc = (acc << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return true;
}

}  // namespace

BpeTokenizerParts read_tiktoken(const fs::path& path) {
  const std::string where = path.string();
  const std::string name = path.filename().string();
  std::string family;
  std::vector<std::pair<std::string, int32_t>> specials;
  if (name.starts_with("cl100k_base")) {
    family = "cl100k";
    specials = {{"<|endoftext|>", 100257},
                {"<|fim_prefix|>", 100258},
                {"<|fim_middle|>", 100259},
                {"<|fim_suffix|>", 100260},
                {"<|endofprompt|>", 100276}};
  } else if (name.starts_with("qwen")) {
    family = "qwen";
    specials = {{"<|endoftext|>", 151643}, {"<|im_start|>", 151644}, {"<|im_end|>", 151645}};
    for (int i = 0; i < 205; ++i) specials.emplace_back(fmt::format("<|extra_{}|>", i), 151646 + i);
  } else {
    fail(
        "{}: unknown tiktoken file: its split pattern is not stored in the file and is known only "
        "for cl100k_base.tiktoken and qwen.tiktoken",
        where);
  }

  std::ifstream in(path);
  if (!in) fail("{}: cannot open file", where);
  BpeTokenizerParts parts;
  parts.source = where;
  BpeModel& m = parts.model;
  std::string line, bytes;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    int32_t rank = -1;
    try {
      if (space != std::string::npos) rank = std::stoi(line.substr(space + 1));
    } catch (const std::exception&) {
    }
    if (space == std::string::npos || rank < 0 || !decode_base64(line.substr(0, space), bytes))
      fail("{}: line {}: expected '<base64 token> <rank>', got '{}'", where, line_no, line);
    check_id(rank, line_no, where, fmt::format("line {}", line_no));
    std::string token = bytes_to_byte_level(bytes);
    if (static_cast<size_t>(rank) >= m.id_to_token.size()) m.id_to_token.resize(rank + 1);
    m.id_to_token[rank] = token;
    m.token_to_id.emplace(std::move(token), rank);
  }
  if (m.token_to_id.size() < 256)
    fail("{}: only {} tokens; expected all 256 bytes and more", where, m.token_to_id.size());
  m.rule = MergeRule::kVocabRank;
  m.ignore_merges = true;  // tiktoken uses a piece that is itself a token directly
  m.finish();
  NamedPreset preset = named_preset(family, where);
  parts.normalizers = std::move(preset.normalizers);
  parts.pre_tokenizers = std::move(preset.pre_tokenizers);
  parts.decoders = byte_level_decoders();
  for (auto& [content, id] : specials) {
    AddedToken a;
    a.content = content;
    a.id = id;
    a.special = true;
    parts.added.push_back(std::move(a));
  }
  return parts;
}

}  // namespace sluice::tok
