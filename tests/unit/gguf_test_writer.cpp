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
#include "model/fp8_weights.h"
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

// An FP8 weight as llama.cpp's converter dequantises it (dequant_simple): each code times its
// 128 × 128 block's weight_scale_inv, in fp32.
std::vector<float> dequantized_fp8(const Checkpoint& ckpt, const TensorEntry& t) {
  std::vector<float> out = to_floats(t);
  const std::vector<float> scale = to_floats(*ckpt.find(fp8_scale_name(t.name)));
  const int64_t n = t.shape[0], k = t.shape[1], blocks = fp8_scale_shape(n, k)[1];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      out[size_t(i * k + j)] *= scale[size_t(i / 128 * blocks + j / 128)];
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

void add_u32(GgufImageWriter& w, const std::string& key, int64_t v) {
  w.add(key, GgufType::kU32, v);
}

void add_f32(GgufImageWriter& w, const std::string& key, double v) {
  w.add(key, GgufType::kF32, v);
}

// The metadata llama.cpp's converter writes: "{arch}.*" from config.json through the family's
// keys (a key whose value the arch implies anyway is left out, as the converter does).
void add_llama_style_metadata(const ModelConfig& c, const GgufNaming& naming, GgufImageWriter& w) {
  const json cfg = config_to_json(c);
  const json implied = json::parse(naming.implied_config);
  const std::string arch = naming.arch;
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

// DbrxModel.set_gguf_parameters, key by key.
void add_dbrx_metadata(const ModelConfig& c, GgufImageWriter& w) {
  add_u32(w, "dbrx.block_count", c.num_layers);
  add_u32(w, "dbrx.context_length", c.max_position_embeddings);
  add_u32(w, "dbrx.embedding_length", c.hidden_size);
  add_u32(w, "dbrx.feed_forward_length", c.expert_intermediate_size);
  add_u32(w, "dbrx.attention.head_count", c.num_heads);
  add_u32(w, "dbrx.attention.head_count_kv", c.num_kv_heads);
  add_f32(w, "dbrx.rope.freq_base", c.rope_theta);
  add_f32(w, "dbrx.attention.clamp_kqv", c.clip_qkv);
  add_u32(w, "dbrx.expert_count", c.num_experts);
  add_u32(w, "dbrx.expert_used_count", c.experts_per_token);
  add_f32(w, "dbrx.attention.layer_norm_epsilon", 1e-5);
}

// DeepseekV2Model.set_gguf_parameters and TextModel's, key by key: MLA written as MQA (one KV
// head of the latent and the RoPE key), the heads' lengths in the _mla keys, YaRN's mscale_all_dim
// as 0.1 · it.
void add_deepseek2_metadata(const ModelConfig& c, GgufImageWriter& w) {
  const std::string p = "deepseek2.";
  const LatentAttentionShape& m = c.mla;
  add_u32(w, p + "block_count", c.num_layers);
  add_u32(w, p + "context_length", c.max_position_embeddings);
  add_u32(w, p + "embedding_length", c.hidden_size);
  add_u32(w, p + "feed_forward_length", c.dense_intermediate_size);
  add_u32(w, p + "attention.head_count", c.num_heads);
  add_u32(w, p + "attention.head_count_kv", 1);
  add_f32(w, p + "rope.freq_base", c.rope_theta);
  add_f32(w, p + "attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  add_u32(w, p + "expert_used_count", c.experts_per_token);
  if (c.family == Family::DeepseekV3 || c.expert_groups > 1) {
    add_u32(w, p + "expert_group_count", c.expert_groups);
    add_u32(w, p + "expert_group_used_count", c.groups_per_token);
  }
  add_u32(w, p + "expert_gating_func", c.router_score == RouterScore::kSigmoid ? 2 : 1);
  add_u32(w, p + "leading_dense_block_count", int64_t(c.dense_layers.size()));
  add_u32(w, p + "vocab_size", c.vocab_size);
  if (m.q_lora_rank > 0) add_u32(w, p + "attention.q_lora_rank", m.q_lora_rank);
  add_u32(w, p + "attention.kv_lora_rank", m.kv_lora_rank);
  add_u32(w, p + "attention.key_length", m.kv_lora_rank + m.qk_rope_head_dim);
  add_u32(w, p + "attention.value_length", m.kv_lora_rank);
  add_u32(w, p + "attention.key_length_mla", m.qk_nope_head_dim + m.qk_rope_head_dim);
  add_u32(w, p + "attention.value_length_mla", m.v_head_dim);
  add_u32(w, p + "expert_feed_forward_length", c.expert_intermediate_size);
  add_u32(w, p + "expert_count", c.num_experts);
  add_u32(w, p + "expert_shared_count",
          c.shared_expert_intermediate_size / c.expert_intermediate_size);
  add_f32(w, p + "expert_weights_scale", c.routed_scaling_factor);
  if (c.normalize_topk) w.add(p + "expert_weights_norm", GgufType::kBool, true);
  add_u32(w, p + "rope.dimension_count", m.qk_rope_head_dim);
  const RopeScaling& y = c.rope_scaling;
  if (y.kind == RopeScalingKind::kYarn) {
    w.add(p + "rope.scaling.type", GgufType::kString, "yarn");
    add_f32(w, p + "rope.scaling.factor", y.factor);
    add_u32(w, p + "rope.scaling.original_context_length", y.original_max_position_embeddings);
    add_f32(w, p + "rope.scaling.yarn_beta_fast", y.beta_fast);
    add_f32(w, p + "rope.scaling.yarn_beta_slow", y.beta_slow);
    add_f32(w, p + "rope.scaling.yarn_log_multiplier", 0.1 * double(y.mscale_all_dim));
  }
}

void add_metadata(const ModelConfig& c, const GgufNaming& naming, GgufImageWriter& w) {
  w.add("general.architecture", GgufType::kString, naming.arch);
  w.add("general.name", GgufType::kString, "sluice test model");
  const std::string arch = naming.arch;
  if (arch == "dbrx")
    add_dbrx_metadata(c, w);
  else if (arch == "deepseek2")
    add_deepseek2_metadata(c, w);
  else
    add_llama_style_metadata(c, naming, w);
}

// The checkpoint's tensors under their GGUF names, experts stacked [E, ...] in expert order.
struct GgufTensor {
  Shape shape;  // row-major
  GgufRows rows = GgufRows::kAsIs;
  std::vector<std::vector<float>> experts;  // one entry unless stacked
};

// A tensor the converter leaves out: a layer past the decoder's (DeepSeek-V3's MTP layer), or
// an FP8 weight's block scales (the weight is written dequantised).
bool left_out(const std::string& name, const GgufNaming& naming, const ModelConfig& c) {
  static const std::regex layer(R"((\d+)\..*)");
  const std::string layers = naming.layer_prefix;
  std::smatch m;
  const std::string rest = name.starts_with(layers) ? name.substr(layers.size()) : "";
  if (std::regex_match(rest, m, layer) && std::stoi(m[1]) >= c.num_layers) return true;
  return name.ends_with("_scale_inv");
}

std::map<std::string, GgufTensor> gather(const Checkpoint& ckpt, const GgufNaming& naming,
                                         const ModelConfig& c) {
  static const std::regex expert(R"(\.experts\.(\d+)\.)");
  std::map<std::string, GgufTensor> out;
  for (const auto& [name, entry] : ckpt.tensors()) {
    if (left_out(name, naming, c)) continue;
    const std::vector<float> values =
        entry.dtype == DType::F8_E4M3 ? dequantized_fp8(ckpt, entry) : to_floats(entry);
    const GgufName gn = gguf_tensor_name(naming, name);
    if (gn.name.empty()) throw Error("no GGUF name for " + name);
    GgufTensor& t = out[gn.name];
    t.rows = gn.rows;
    std::smatch m;
    if (std::regex_search(name, m, expert)) {
      const size_t e = std::stoul(m[1]);
      if (t.experts.size() <= e) t.experts.resize(e + 1);
      t.experts[e] = values;
      t.shape = entry.shape;
      t.shape.insert(t.shape.begin(), int64_t(t.experts.size()));
    } else {
      t.experts = {values};
      t.shape = entry.shape;
    }
  }
  return out;
}

// DbrxModel.modify_tensors: each flat [E·ffn, hidden] expert tensor viewed [E, ffn, hidden], w2
// (ffn_down_exps) permuted (0, 2, 1) to [E, hidden, ffn].
void stack_dbrx_experts(std::map<std::string, GgufTensor>& tensors, const ModelConfig& c) {
  const int64_t E = c.num_experts, I = c.expert_intermediate_size, H = c.hidden_size;
  for (auto& [name, t] : tensors) {
    if (name.ends_with("ffn_gate_exps.weight") || name.ends_with("ffn_up_exps.weight"))
      t.shape = {E, I, H};
    if (!name.ends_with("ffn_down_exps.weight")) continue;
    const std::vector<float>& x = t.experts[0];
    std::vector<float> out(x.size());
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < I; ++i)
        for (int64_t h = 0; h < H; ++h)
          out[size_t((e * H + h) * I + i)] = x[size_t((e * I + i) * H + h)];
    t.shape = {E, H, I};
    t.experts = {std::move(out)};
  }
}

// DeepseekV2Model.modify_tensors: kv_b_proj viewed [heads, qk_nope + v, R] and split into
// attn_k_b (the k rows, transposed to [heads, R, qk_nope]) and attn_v_b [heads, v, R].
void split_latent_kv(std::map<std::string, GgufTensor>& tensors, const ModelConfig& c) {
  const int64_t heads = c.num_heads, R = c.mla.kv_lora_rank, nope = c.mla.qk_nope_head_dim,
                v = c.mla.v_head_dim;
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors)
    if (name.ends_with("attn_kv_b.weight")) names.push_back(name);
  for (const std::string& name : names) {
    const std::vector<float>& x = tensors[name].experts[0];
    std::vector<float> k(size_t(heads * R * nope)), vb(size_t(heads * v * R));
    for (int64_t h = 0; h < heads; ++h) {
      const float* head = x.data() + h * (nope + v) * R;
      for (int64_t i = 0; i < nope; ++i)
        for (int64_t r = 0; r < R; ++r) k[size_t((h * R + r) * nope + i)] = head[i * R + r];
      std::copy_n(head + nope * R, v * R, vb.data() + h * v * R);
    }
    const std::string stem = name.substr(0, name.size() - std::string("kv_b.weight").size());
    tensors[stem + "k_b.weight"] = {{heads, R, nope}, GgufRows::kAsIs, {std::move(k)}};
    tensors[stem + "v_b.weight"] = {{heads, v, R}, GgufRows::kAsIs, {std::move(vb)}};
    tensors.erase(name);
  }
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
                                      int parts, const std::function<void(GgufImageWriter&)>& edit,
                                      GgufLatentKv latent_kv) {
  const ModelConfig c = load_config(hf_dir / "config.json");
  const GgufNaming& naming = *family_spec(c.family).gguf;
  const Checkpoint ckpt = Checkpoint::open(hf_dir);
  std::vector<GgufImageWriter> writers(static_cast<size_t>(parts));
  add_metadata(c, naming, writers[0]);
  add_tokenizer(hf_dir, c, writers[0]);

  auto tensors = gather(ckpt, naming, c);
  if (c.family == Family::Dbrx) stack_dbrx_experts(tensors, c);
  if (c.attention == AttentionKind::kLatent && latent_kv == GgufLatentKv::kSplit)
    split_latent_kv(tensors, c);
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
  // The file holds kv_b split (attn_k_b rows of qk_nope values, attn_v_b of kv_lora_rank);
  // quantising kv_b whole is the same only while neither is whole blocks.
  const LatentAttentionShape& mla = m.config.mla;
  if (m.config.attention == AttentionKind::kLatent &&
      (mla.qk_nope_head_dim % 32 == 0 || mla.kv_lora_rank % 32 == 0))
    throw Error("round_trip_quantized: a quantised split kv_b is not modelled");
  ModelWeights& w = m.weights;
  round_trip(w.embed);
  for (LayerWeights& L : w.layers)
    for (Tensor* t :
         {&L.attn_norm, &L.wq,          &L.wk,          &L.wv,        &L.wo,          &L.bq,
          &L.bk,        &L.bv,          &L.bo,          &L.q_norm,    &L.k_norm,      &L.q_a,
          &L.q_a_norm,  &L.q_b,         &L.kv_a,        &L.kv_a_norm, &L.kv_b,        &L.ffn_norm,
          &L.router,    &L.router_bias, &L.expert_gate, &L.expert_up, &L.expert_down, &L.mlp_gate,
          &L.mlp_up,    &L.mlp_down,    &L.mlp_scale})
      round_trip(*t);
  round_trip(w.final_norm);
  if (m.config.tie_word_embeddings)
    w.lm_head = w.embed;
  else
    round_trip(w.lm_head);
}

}  // namespace sluice::testing
