#include "gguf_test_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>

#include "core/dtype.h"
#include "core/error.h"
#include "io/gguf_dequant.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/family.h"
#include "model/gguf_model.h"

namespace sluice::testing {

namespace {

using nlohmann::json;

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

void put_value(std::string& out, GgufType type, GgufType element, const json& v) {
  switch (type) {
    case GgufType::kU8:
      return put<uint8_t>(out, v.get<uint8_t>());
    case GgufType::kI8:
      return put<int8_t>(out, v.get<int8_t>());
    case GgufType::kU16:
      return put<uint16_t>(out, v.get<uint16_t>());
    case GgufType::kI16:
      return put<int16_t>(out, v.get<int16_t>());
    case GgufType::kU32:
      return put<uint32_t>(out, v.get<uint32_t>());
    case GgufType::kI32:
      return put<int32_t>(out, v.get<int32_t>());
    case GgufType::kF32:
      return put<float>(out, v.get<float>());
    case GgufType::kBool:
      return put<uint8_t>(out, v.get<bool>() ? 1 : 0);
    case GgufType::kString:
      return put_string(out, v.get<std::string>());
    case GgufType::kU64:
      return put<uint64_t>(out, v.get<uint64_t>());
    case GgufType::kI64:
      return put<int64_t>(out, v.get<int64_t>());
    case GgufType::kF64:
      return put<double>(out, v.get<double>());
    case GgufType::kArray:
      put<uint32_t>(out, uint32_t(element));
      put<uint64_t>(out, v.size());
      for (const auto& e : v) put_value(out, element, GgufType::kU8, e);
      return;
  }
}

size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

uint16_t f16_bits(float x) {
  return f32_to_f16(x);
}

std::vector<float> to_floats(const TensorEntry& t) {
  std::vector<float> out(size_t(shape_numel(t.shape)));
  to_f32(t.dtype, t.file->data() + t.offset, out.data(), out.size());
  return out;
}

// The bytes of `x` (rows of `row` values) in `weights`' type for a tensor of `shape`.
std::pair<uint32_t, std::vector<uint8_t>> encode(const std::vector<float>& x, const Shape& shape,
                                                 GgufWeights weights) {
  std::vector<uint8_t> bytes;
  const bool quantized =
      stored_quantized(shape) && (weights == GgufWeights::kQ8_0 || weights == GgufWeights::kQ4_0);
  if (quantized) {
    bytes = weights == GgufWeights::kQ8_0 ? quantize_q8_0(x.data(), int64_t(x.size()))
                                          : quantize_q4_0(x.data(), int64_t(x.size()));
    return {uint32_t(weights == GgufWeights::kQ8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0), bytes};
  }
  if (weights == GgufWeights::kBF16 && shape.size() > 1) {
    bytes.resize(x.size() * 2);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t h = f32_to_bf16(x[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
    return {uint32_t(GgmlType::BF16), bytes};
  }
  bytes.resize(x.size() * 4);
  std::memcpy(bytes.data(), x.data(), bytes.size());
  return {uint32_t(GgmlType::F32), bytes};
}

// The tokenizer of the folder as llama.cpp's "gpt2" vocabulary (tokens in id order, merges,
// control tokens, bos/eos, the chat template and the pre-tokenizer's name).
void add_tokenizer(const std::filesystem::path& dir, const ModelConfig& c, GgufImageWriter& w) {
  std::ifstream in(dir / "tokenizer.json");
  const json tok = json::parse(in);
  std::map<int64_t, std::string> by_id;
  for (const auto& [text, id] : tok["model"]["vocab"].items()) by_id[id.get<int64_t>()] = text;
  std::map<int64_t, bool> special;
  for (const auto& a : tok["added_tokens"]) {
    by_id[a["id"].get<int64_t>()] = a["content"].get<std::string>();
    special[a["id"].get<int64_t>()] = true;
  }
  json tokens = json::array(), types = json::array();
  for (int64_t id = 0; id <= by_id.rbegin()->first; ++id) {
    const auto it = by_id.find(id);
    tokens.push_back(it != by_id.end() ? it->second : fmt::format("[PAD{}]", id));
    types.push_back(it == by_id.end() ? 5 : special.count(id) ? 3 : 1);
  }
  const TokenizerStyle& style = family_spec(c.family).tokenizer;
  w.add("tokenizer.ggml.model", GgufType::kString, "gpt2");
  w.add("tokenizer.ggml.pre", GgufType::kString,
        style.split_pattern ? style.split_pattern : "gpt-2");
  w.add("tokenizer.ggml.tokens", GgufType::kArray, tokens, GgufType::kString);
  w.add("tokenizer.ggml.token_type", GgufType::kArray, types, GgufType::kI32);
  w.add("tokenizer.ggml.merges", GgufType::kArray, tok["model"]["merges"], GgufType::kString);
  if (c.bos_token_id >= 0) w.add("tokenizer.ggml.bos_token_id", GgufType::kU32, c.bos_token_id);
  if (!c.eos_token_ids.empty())
    w.add("tokenizer.ggml.eos_token_id", GgufType::kU32, c.eos_token_ids[0]);
  w.add("tokenizer.ggml.add_bos_token", GgufType::kBool, style.add_bos);
  if (style.chat_template) w.add("tokenizer.chat_template", GgufType::kString, style.chat_template);
}

void add_value(GgufImageWriter& w, const std::string& key, const json& v) {
  if (v.is_boolean())
    w.add(key, GgufType::kBool, v);
  else if (v.is_number_integer())
    w.add(key, GgufType::kU32, v);
  else if (v.is_number())
    w.add(key, GgufType::kF32, v);
}

// The metadata llama.cpp's converter writes: general.*, "{arch}.*" from config.json through the
// family's keys (a key whose value the arch implies anyway is left out, as the converter does).
void add_metadata(const ModelConfig& c, const GgufNaming& naming, GgufImageWriter& w) {
  const json cfg = config_to_json(c);
  const json implied = json::parse(naming.implied_config);
  const std::string arch = naming.arch;
  w.add("general.architecture", GgufType::kString, arch);
  w.add("general.name", GgufType::kString, "sluice test model");
  const std::vector<GgufKey> common = {{"hidden_size", "embedding_length"},
                                       {"num_hidden_layers", "block_count"},
                                       {"num_attention_heads", "attention.head_count"},
                                       {"num_key_value_heads", "attention.head_count_kv"},
                                       {"rms_norm_eps", "attention.layer_norm_rms_epsilon"},
                                       {"rope_theta", "rope.freq_base"},
                                       {"max_position_embeddings", "context_length"}};
  for (const auto* keys : {&common, &naming.keys})
    for (const GgufKey& k : *keys) {
      if (!cfg.contains(k.config) || cfg[k.config].is_null()) continue;
      if (implied.contains(k.config) && implied[k.config] == cfg[k.config]) continue;
      if (cfg[k.config].is_boolean() && !cfg[k.config].get<bool>() && !implied.contains(k.config))
        continue;
      add_value(w, arch + "." + k.gguf, cfg[k.config]);
    }
  // Qwen3 writes head_dim as attention.key_length; elsewhere it is hidden / heads.
  if (c.head_dim * c.num_heads != c.hidden_size)
    w.add(arch + ".attention.key_length", GgufType::kU32, c.head_dim);
}

// The checkpoint's tensors under their GGUF names, experts stacked [E, ...] in expert order.
struct GgufTensor {
  Shape shape;  // row-major
  GgufRows rows = GgufRows::kAsIs;
  std::vector<std::vector<float>> experts;  // one entry unless stacked
};

std::map<std::string, GgufTensor> gather(const Checkpoint& ckpt, const GgufNaming& naming) {
  static const std::regex expert(R"(\.experts\.(\d+)\.)");
  std::map<std::string, GgufTensor> out;
  for (const auto& [name, entry] : ckpt.tensors()) {
    const GgufName gn = gguf_tensor_name(naming, name);
    if (gn.name.empty()) throw Error("no GGUF name for " + name);
    GgufTensor& t = out[gn.name];
    t.rows = gn.rows;
    std::smatch m;
    if (std::regex_search(name, m, expert)) {
      const size_t e = std::stoul(m[1]);
      if (t.experts.size() <= e) t.experts.resize(e + 1);
      t.experts[e] = to_floats(entry);
      t.shape = entry.shape;
      t.shape.insert(t.shape.begin(), int64_t(t.experts.size()));
    } else {
      t.experts = {to_floats(entry)};
      t.shape = entry.shape;
    }
  }
  return out;
}

std::vector<float> rows_permuted(const std::vector<float>& x, const GgufTensor& t,
                                 const ModelConfig& c) {
  const int64_t heads = t.rows == GgufRows::kQueryHeads ? c.num_heads : c.num_kv_heads;
  const size_t row_bytes = x.size() * 4 / size_t(heads * c.head_dim);
  const std::vector<uint8_t> p = permute_qk_rows(x.data(), heads, c.head_dim, row_bytes);
  std::vector<float> out(x.size());
  std::memcpy(out.data(), p.data(), p.size());
  return out;
}

}  // namespace

void GgufImageWriter::add(const std::string& key, GgufType type, json value, GgufType element) {
  kvs_.push_back({key, type, element, std::move(value)});
}

void GgufImageWriter::add_tensor(const std::string& name, uint32_t type, Shape dims,
                                 std::vector<uint8_t> bytes) {
  tensors_.push_back({name, type, std::move(dims), std::move(bytes)});
}

void GgufImageWriter::replace(const std::string& key, GgufType type, json value) {
  remove(key);
  add(key, type, std::move(value));
}

void GgufImageWriter::remove(const std::string& key) {
  std::erase_if(kvs_, [&](const Kv& kv) { return kv.key == key; });
}

void GgufImageWriter::retype_tensor(const std::string& name, uint32_t type) {
  for (T& t : tensors_)
    if (t.name == name) t.type = type;
}

void GgufImageWriter::remove_tensor(const std::string& name) {
  std::erase_if(tensors_, [&](const T& t) { return t.name == name; });
}

void GgufImageWriter::redim_tensor(const std::string& name, Shape dims) {
  for (T& t : tensors_)
    if (t.name == name) t.dims = std::move(dims);
}

bool GgufImageWriter::has_tensor(const std::string& name) const {
  for (const T& t : tensors_)
    if (t.name == name) return true;
  return false;
}

std::string GgufImageWriter::header_and_infos(size_t alignment, uint32_t version) const {
  std::string out;
  put<uint32_t>(out, 0x46554747);
  put<uint32_t>(out, version);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kvs_.size());
  for (const Kv& kv : kvs_) {
    put_string(out, kv.key);
    put<uint32_t>(out, uint32_t(kv.type));
    put_value(out, kv.type, kv.element, kv.value);
  }
  size_t offset = 0;
  for (const T& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, uint32_t(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(out, uint64_t(d));
    put<uint32_t>(out, t.type);
    put<uint64_t>(out, offset);
    offset = align_up(offset + t.bytes.size(), alignment);
  }
  return out;
}

size_t GgufImageWriter::tensor_type_field_offset(size_t index) const {
  // Rebuild the header up to tensor `index`'s info and add its name and dims.
  GgufImageWriter head = *this;
  head.tensors_.resize(index);
  const std::string before = head.header_and_infos(32, 3);
  // The tensor count in the header is the same width whatever its value.
  const T& t = tensors_[index];
  return before.size() + 8 + t.name.size() + 4 + 8 * t.dims.size();
}

std::string GgufImageWriter::image(size_t alignment, uint32_t version) const {
  std::string out = header_and_infos(alignment, version);
  out.resize(align_up(out.size(), alignment), '\0');
  for (const T& t : tensors_) {
    out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    out.resize(align_up(out.size(), alignment), '\0');
  }
  return out;
}

void GgufImageWriter::write(const std::filesystem::path& path, size_t alignment) const {
  const std::string bytes = image(alignment);
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::vector<uint8_t> quantize_q8_0(const float* x, int64_t n) {
  std::vector<uint8_t> out;
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;
    const uint16_t h = f16_bits(d);
    out.push_back(uint8_t(h & 0xFF));
    out.push_back(uint8_t(h >> 8));
    for (int j = 0; j < 32; ++j) out.push_back(uint8_t(int8_t(std::roundf(x[b + j] * id))));
  }
  return out;
}

std::vector<uint8_t> quantize_q4_0(const float* x, int64_t n) {
  std::vector<uint8_t> out;
  for (int64_t b = 0; b < n; b += 32) {
    // The value of largest magnitude, with its sign, maps to -8.
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[b + j]) > amax) {
        amax = std::fabs(x[b + j]);
        max = x[b + j];
      }
    const float d = max / -8.f, id = d != 0 ? 1.f / d : 0.f;
    const uint16_t h = f16_bits(d);
    out.push_back(uint8_t(h & 0xFF));
    out.push_back(uint8_t(h >> 8));
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, int(int8_t(x[b + j] * id + 8.5f)));
      const int hi = std::min(15, int(int8_t(x[b + j + 16] * id + 8.5f)));
      out.push_back(uint8_t(lo | (hi << 4)));
    }
  }
  return out;
}

std::vector<uint8_t> permute_qk_rows(const void* src, int64_t heads, int64_t head_dim,
                                     size_t row_bytes) {
  std::vector<uint8_t> out(size_t(heads * head_dim) * row_bytes);
  const auto* s = static_cast<const uint8_t*>(src);
  const int64_t half = head_dim / 2;
  // reshape(heads, 2, d/2, ...).swapaxes(1, 2): [h][j][i] → [h][i][j].
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t i = 0; i < half; ++i)
        std::memcpy(out.data() + size_t(h * head_dim + i * 2 + j) * row_bytes,
                    s + size_t(h * head_dim + j * half + i) * row_bytes, row_bytes);
  return out;
}

const char* gguf_weights_name(GgufWeights w) {
  switch (w) {
    case GgufWeights::kF32:
      return "F32";
    case GgufWeights::kBF16:
      return "BF16";
    case GgufWeights::kQ8_0:
      return "Q8_0";
    case GgufWeights::kQ4_0:
      return "Q4_0";
  }
  return "?";
}

bool stored_quantized(const Shape& shape) {
  return shape.size() >= 2 && shape.back() % 32 == 0;
}

std::filesystem::path convert_to_gguf(const std::filesystem::path& hf_dir,
                                      const std::filesystem::path& out, GgufWeights weights,
                                      int parts,
                                      const std::function<void(GgufImageWriter&)>& edit) {
  const ModelConfig c = load_config(hf_dir / "config.json");
  const GgufNaming& naming = *family_spec(c.family).gguf;
  const Checkpoint ckpt = Checkpoint::open(hf_dir);
  std::vector<GgufImageWriter> writers(static_cast<size_t>(parts));
  add_metadata(c, naming, writers[0]);
  add_tokenizer(hf_dir, c, writers[0]);

  const auto tensors = gather(ckpt, naming);
  size_t index = 0;
  for (const auto& [name, t] : tensors) {
    std::vector<float> values;
    for (const auto& e : t.experts) {
      const std::vector<float> v =
          naming.interleaved_qk && t.rows != GgufRows::kAsIs ? rows_permuted(e, t, c) : e;
      values.insert(values.end(), v.begin(), v.end());
    }
    auto [type, bytes] = encode(values, t.shape, weights);
    writers[index++ % size_t(parts)].add_tensor(name, type, Shape(t.shape.rbegin(), t.shape.rend()),
                                                std::move(bytes));
  }
  if (edit) edit(writers[0]);
  if (parts == 1) {
    writers[0].write(out);
    return out;
  }
  const std::string stem = out.stem().string();
  std::filesystem::path first;
  for (int p = 0; p < parts; ++p) {
    writers[size_t(p)].add("split.no", GgufType::kU16, p);
    writers[size_t(p)].add("split.count", GgufType::kU16, parts);
    const auto path = out.parent_path() / fmt::format("{}-{:05}-of-{:05}.gguf", stem, p + 1, parts);
    writers[size_t(p)].write(path);
    if (p == 0) first = path;
  }
  return first;
}

void round_trip_quantized(Model& m, GgufWeights weights) {
  auto round_trip = [&](Tensor& t) {
    if (t.empty() || !stored_quantized(t.shape)) return;
    std::vector<float> x(size_t(t.numel()));
    to_f32(t.dtype, t.data, x.data(), x.size());
    const auto q = weights == GgufWeights::kQ8_0 ? quantize_q8_0(x.data(), int64_t(x.size()))
                                                 : quantize_q4_0(x.data(), int64_t(x.size()));
    dequantize(uint32_t(weights == GgufWeights::kQ8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0), q.data(),
               x.data(), int64_t(x.size()));
    Tensor out = Tensor::allocate(DType::BF16, t.shape);
    for (size_t i = 0; i < x.size(); ++i) out.as<uint16_t>()[i] = f32_to_bf16(x[i]);
    t = std::move(out);
  };
  ModelWeights& w = m.weights;
  round_trip(w.embed);
  for (LayerWeights& L : w.layers)
    for (Tensor* t : {&L.attn_norm,   &L.wq,       &L.wk,     &L.wv,          &L.wo,
                      &L.bq,          &L.bk,       &L.bv,     &L.bo,          &L.q_norm,
                      &L.k_norm,      &L.ffn_norm, &L.router, &L.expert_gate, &L.expert_up,
                      &L.expert_down, &L.mlp_gate, &L.mlp_up, &L.mlp_down,    &L.mlp_scale})
      round_trip(*t);
  round_trip(w.final_norm);
  if (m.config.tie_word_embeddings)
    w.lm_head = w.embed;
  else
    round_trip(w.lm_head);
}

}  // namespace sluice::testing
