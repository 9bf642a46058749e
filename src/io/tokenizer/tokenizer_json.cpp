// Reader of the Hugging Face `tokenizers` JSON schema (model BPE only).
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_number.h"
#include "io/tokenizer/loaders.h"

namespace sluice::tok {

namespace {

using nlohmann::json;

json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open file", path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
}

// Reads `j[key]` as T, failing with the file and field named when it is missing or mistyped.
template <class T>
T get(const json& j, const char* key, const std::string& where, const std::string& field) {
  if (!j.is_object() || !j.contains(key)) fail("{}: field '{}.{}': missing", where, field, key);
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    fail("{}: field '{}.{}': wrong type ({})", where, field, key, j.at(key).type_name());
  }
}

// An id or a count: a JSON integer in [0, 2^31).
int32_t as_index(const json& v, const std::string& where, const std::string& field) {
  const auto i = json_integer(v, 0, INT32_MAX);
  if (!i)
    fail("{}: field '{}': expected an integer in [0, 2^31), got {}", where, field, json_excerpt(v));
  return int32_t(*i);
}

int32_t get_index(const json& j, const char* key, const std::string& where,
                  const std::string& field) {
  if (!j.is_object() || !j.contains(key)) fail("{}: field '{}.{}': missing", where, field, key);
  return as_index(j.at(key), where, field + "." + key);
}

template <class T>
T get_or(const json& j, const char* key, T fallback) {
  if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return fallback;
  return j.at(key).get<T>();
}

// "String" patterns are literal text; "Regex" patterns are regular expressions.
std::string pattern_as_regex(const json& pattern, const std::string& where,
                             const std::string& field) {
  if (pattern.contains("Regex")) return get<std::string>(pattern, "Regex", where, field);
  if (pattern.contains("String")) {
    const auto s = get<std::string>(pattern, "String", where, field);
    return "\\Q" + s + "\\E";
  }
  fail("{}: field '{}': expected {{\"String\": ...}} or {{\"Regex\": ...}}", where, field);
}

void read_normalizer(const json& j, const std::string& where, const std::string& field,
                     std::vector<NormalizerStep>& out) {
  if (j.is_null()) return;
  const auto type = get<std::string>(j, "type", where, field);
  if (type == "Sequence") {
    const auto& list = j.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(list[i], where, fmt::format("{}.normalizers[{}]", field, i), out);
  } else if (type == "Prepend") {
    out.push_back(Prepend{get<std::string>(j, "prepend", where, field)});
  } else if (type == "Replace") {
    const json& pattern = j.at("pattern");
    if (!pattern.contains("String"))
      fail("{}: field '{}.pattern': only String patterns are supported for Replace", where, field);
    out.push_back(Replace{get<std::string>(pattern, "String", where, field + ".pattern"),
                          get<std::string>(j, "content", where, field)});
  } else if (type == "NFC") {
    out.push_back(Nfc{});
  } else {
    fail(
        "{}: field '{}.type': unsupported normalizer '{}' (supported: Sequence, Prepend, "
        "Replace with a String pattern, NFC)",
        where, field, type);
  }
}

SplitBehavior parse_behavior(const std::string& b, const std::string& where,
                             const std::string& field) {
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  fail("{}: field '{}.behavior': unknown value '{}'", where, field, b);
}

PrependScheme parse_prepend_scheme(const json& j) {
  if (j.contains("prepend_scheme")) {
    const auto s = j.at("prepend_scheme").get<std::string>();
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    return PrependScheme::kAlways;
  }
  // Older files: add_prefix_space.
  return get_or(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

void read_pre_tokenizer(const json& j, const std::string& where, const std::string& field,
                        std::vector<PreTokenizerStep>& out) {
  if (j.is_null()) return;
  const auto type = get<std::string>(j, "type", where, field);
  if (type == "Sequence") {
    const auto& list = j.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(list[i], where, fmt::format("{}.pretokenizers[{}]", field, i), out);
  } else if (type == "ByteLevel") {
    out.push_back(ByteLevel{get_or(j, "add_prefix_space", false), get_or(j, "use_regex", true)});
  } else if (type == "Split") {
    Split s;
    s.regex = std::make_shared<Regex>(pattern_as_regex(j.at("pattern"), where, field + ".pattern"),
                                      where + ": field '" + field + ".pattern'");
    s.behavior = parse_behavior(get<std::string>(j, "behavior", where, field), where, field);
    s.invert = get_or(j, "invert", false);
    out.push_back(std::move(s));
  } else if (type == "Metaspace") {
    Metaspace m;
    m.replacement = get_or<std::string>(j, "replacement", m.replacement);
    m.prepend = parse_prepend_scheme(j);
    m.split = get_or(j, "split", true);
    out.push_back(std::move(m));
  } else if (type == "Digits") {
    out.push_back(Digits{get_or(j, "individual_digits", false)});
  } else {
    fail(
        "{}: field '{}.type': unsupported pre-tokenizer '{}' (supported: Sequence, ByteLevel, "
        "Split, Metaspace, Digits)",
        where, field, type);
  }
}

void read_decoder(const json& j, const std::string& where, const std::string& field,
                  std::vector<DecoderStep>& out) {
  if (j.is_null()) return;
  const auto type = get<std::string>(j, "type", where, field);
  if (type == "Sequence") {
    const auto& list = j.at("decoders");
    for (size_t i = 0; i < list.size(); ++i)
      read_decoder(list[i], where, fmt::format("{}.decoders[{}]", field, i), out);
  } else if (type == "ByteLevel") {
    out.push_back(ByteLevelDecoder{});
  } else if (type == "Replace") {
    const json& pattern = j.at("pattern");
    if (!pattern.contains("String"))
      fail("{}: field '{}.pattern': only String patterns are supported for Replace", where, field);
    out.push_back(ReplaceDecoder{get<std::string>(pattern, "String", where, field + ".pattern"),
                                 get<std::string>(j, "content", where, field)});
  } else if (type == "ByteFallback") {
    out.push_back(ByteFallbackDecoder{});
  } else if (type == "Fuse") {
    out.push_back(FuseDecoder{});
  } else if (type == "Strip") {
    out.push_back(StripDecoder{get<std::string>(j, "content", where, field),
                               get_index(j, "start", where, field),
                               get_index(j, "stop", where, field)});
  } else if (type == "Metaspace") {
    MetaspaceDecoder m;
    m.replacement = get_or<std::string>(j, "replacement", m.replacement);
    m.strip_first_space = parse_prepend_scheme(j) != PrependScheme::kNever;
    out.push_back(std::move(m));
  } else {
    fail(
        "{}: field '{}.type': unsupported decoder '{}' (supported: Sequence, ByteLevel, Replace, "
        "ByteFallback, Fuse, Strip, Metaspace)",
        where, field, type);
  }
}

void read_post_processor(const json& j, const std::string& where, const std::string& field,
                         BpeTokenizerParts& parts) {
  if (j.is_null()) return;
  const auto type = get<std::string>(j, "type", where, field);
  if (type == "Sequence") {
    const auto& list = j.at("processors");
    for (size_t i = 0; i < list.size(); ++i)
      read_post_processor(list[i], where, fmt::format("{}.processors[{}]", field, i), parts);
  } else if (type == "ByteLevel") {
    // Only adjusts offsets; ids are unchanged.
  } else if (type == "TemplateProcessing") {
    const json& specials = j.at("special_tokens");
    bool seen_sequence = false;
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const auto name = get<std::string>(item.at("SpecialToken"), "id", where, field + ".single");
      if (!specials.contains(name))
        fail("{}: field '{}.special_tokens': no entry for '{}'", where, field, name);
      const std::string ids_field = field + ".special_tokens." + name + ".ids";
      const json& ids = get<json>(specials.at(name), "ids", where, ids_field);
      if (!ids.is_array()) fail("{}: field '{}': expected a list of ids", where, ids_field);
      auto& target = seen_sequence ? parts.suffix_ids : parts.prefix_ids;
      for (const json& id : ids) target.push_back(as_index(id, where, ids_field));
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    parts.prefix_ids.push_back(as_index(j.at("cls").at(1), where, field + ".cls[1]"));
    parts.suffix_ids.push_back(as_index(j.at("sep").at(1), where, field + ".sep[1]"));
  } else {
    fail(
        "{}: field '{}.type': unsupported post-processor '{}' (supported: Sequence, ByteLevel, "
        "TemplateProcessing, RobertaProcessing, BertProcessing)",
        where, field, type);
  }
}

void read_bpe_model(const json& m, const std::string& where, BpeModel& model) {
  const auto type = get_or<std::string>(m, "type", "BPE");
  if (type != "BPE")
    fail("{}: field 'model.type': unsupported model '{}' (only BPE is supported)", where, type);
  if (!get_or<std::string>(m, "continuing_subword_prefix", "").empty() ||
      !get_or<std::string>(m, "end_of_word_suffix", "").empty())
    fail("{}: field 'model.continuing_subword_prefix/end_of_word_suffix': not supported", where);
  const json& vocab = m.at("vocab");
  if (!vocab.is_object()) fail("{}: field 'model.vocab': expected an object", where);
  for (const auto& [token, id_json] : vocab.items()) {
    const int32_t id = as_index(id_json, where, "model.vocab." + token);
    check_id(id, vocab.size(), where, "model.vocab." + token);
    if (static_cast<size_t>(id) >= model.id_to_token.size()) model.id_to_token.resize(id + 1);
    model.id_to_token[id] = token;
    model.token_to_id.emplace(token, id);
  }
  const json& merges = m.at("merges");
  model.merge_ranks.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& merge = merges[rank];
    std::string left, right;
    if (merge.is_string()) {
      const auto s = merge.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos)
        fail("{}: field 'model.merges[{}]': expected \"left right\", got \"{}\"", where, rank, s);
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      fail("{}: field 'model.merges[{}]': expected a string or a pair", where, rank);
    }
    const int32_t a = model.find(left), b = model.find(right);
    if (a < 0 || b < 0 || model.find(left + right) < 0)
      fail("{}: field 'model.merges[{}]': '{}' + '{}' uses tokens missing from the vocabulary",
           where, rank, left, right);
    model.merge_ranks.emplace(static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b),
                              static_cast<int32_t>(rank));
  }
  model.rule = MergeRule::kMergeList;
  model.byte_fallback = get_or(m, "byte_fallback", false);
  model.fuse_unk = get_or(m, "fuse_unk", false);
  model.ignore_merges = get_or(m, "ignore_merges", false);
  const auto unk = get_or<std::string>(m, "unk_token", "");
  if (!unk.empty()) {
    model.unk_id = model.find(unk);
    if (model.unk_id < 0)
      fail("{}: field 'model.unk_token': '{}' is not in the vocabulary", where, unk);
  }
  model.finish();
}

// Runs a reader of the document `where`: a shape it did not check for (the `at` of a missing key,
// a list where an object belongs) becomes an error naming the file.
template <class F>
auto naming_file(const std::string& where, F&& read) {
  try {
    return read();
  } catch (const json::exception& e) {
    fail("{}: unexpected structure: {}", where, e.what());
  }
}

BpeTokenizerParts tokenizer_json_parts(const json& j, const std::string& where) {
  BpeTokenizerParts parts;
  parts.source = where;
  if (!j.contains("model")) fail("{}: field 'model': missing", where);
  read_bpe_model(j.at("model"), where, parts.model);
  if (j.contains("added_tokens")) {
    for (const json& a : j.at("added_tokens")) {
      AddedToken t;
      t.content = get<std::string>(a, "content", where, "added_tokens[]");
      t.id = get_index(a, "id", where, "added_tokens[]");
      t.special = get_or(a, "special", false);
      t.normalized = get_or(a, "normalized", !t.special);
      t.lstrip = get_or(a, "lstrip", false);
      t.rstrip = get_or(a, "rstrip", false);
      t.single_word = get_or(a, "single_word", false);
      parts.added.push_back(std::move(t));
    }
  }
  read_normalizer(j.value("normalizer", json()), where, "normalizer", parts.normalizers);
  read_pre_tokenizer(j.value("pre_tokenizer", json()), where, "pre_tokenizer",
                     parts.pre_tokenizers);
  read_post_processor(j.value("post_processor", json()), where, "post_processor", parts);
  read_decoder(j.value("decoder", json()), where, "decoder", parts.decoders);
  return parts;
}

}  // namespace

BpeTokenizerParts read_tokenizer_json(const fs::path& path) {
  const std::string where = path.string();
  const json j = read_json(path);
  return naming_file(where, [&] { return tokenizer_json_parts(j, where); });
}

BpeTokenizerParts read_vocab_and_merges(const fs::path& vocab_json, const fs::path& merges_txt,
                                        std::string_view pre_tokenizer) {
  // Reuses the tokenizer.json model reader on an equivalent document.
  json model = {{"type", "BPE"}, {"vocab", read_json(vocab_json)}, {"merges", json::array()}};
  std::ifstream in(merges_txt);
  if (!in) fail("{}: cannot open file", merges_txt.string());
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("#version") || line.empty()) continue;
    model["merges"].push_back(line);
  }
  BpeTokenizerParts parts;
  parts.source = vocab_json.string();
  const std::string where = vocab_json.string() + " + " + merges_txt.string();
  naming_file(where, [&] { read_bpe_model(model, where, parts.model); });
  NamedPreset preset = named_preset(pre_tokenizer, parts.source);
  parts.normalizers = std::move(preset.normalizers);
  parts.pre_tokenizers = std::move(preset.pre_tokenizers);
  parts.decoders = byte_level_decoders();
  return parts;
}

namespace {

std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content")) return j.at("content").get<std::string>();
  return {};
}

TokenizerConfig tokenizer_config(const json& j, const std::string& where) {
  TokenizerConfig c;
  if (j.contains("add_bos_token") && j.at("add_bos_token").is_boolean())
    c.add_bos = j.at("add_bos_token").get<bool>();
  if (j.contains("add_eos_token") && j.at("add_eos_token").is_boolean())
    c.add_eos = j.at("add_eos_token").get<bool>();
  if (j.contains("bos_token")) c.bos_token = token_content(j.at("bos_token"));
  if (j.contains("eos_token")) c.eos_token = token_content(j.at("eos_token"));
  if (j.contains("chat_template") && j.at("chat_template").is_string())
    c.chat_template = j.at("chat_template").get<std::string>();
  c.tokenizer_class = get_or<std::string>(j, "tokenizer_class", "");
  if (j.contains("added_tokens_decoder")) {
    for (const auto& [id, a] : j.at("added_tokens_decoder").items()) {
      AddedToken t;
      const auto number = json_integer(json::parse(id, nullptr, false), 0, INT32_MAX);
      if (!number)
        fail("{}: field 'added_tokens_decoder': key '{}' is not an id in [0, 2^31)", where, id);
      t.id = int32_t(*number);
      t.content = get<std::string>(a, "content", where, "added_tokens_decoder." + id);
      t.special = get_or(a, "special", false);
      t.normalized = get_or(a, "normalized", !t.special);
      t.lstrip = get_or(a, "lstrip", false);
      t.rstrip = get_or(a, "rstrip", false);
      t.single_word = get_or(a, "single_word", false);
      c.added.push_back(std::move(t));
    }
  }
  return c;
}

}  // namespace

TokenizerConfig read_tokenizer_config(const fs::path& path) {
  const std::string where = path.string();
  const json j = read_json(path);
  return naming_file(where, [&] { return tokenizer_config(j, where); });
}

}  // namespace sluice::tok
