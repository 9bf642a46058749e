#include "model/gguf_export.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/dtype.h"
#include "core/error.h"
#include "io/gguf_quantize.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/family.h"
#include "model/fp8_weights.h"
#include "model/gguf_model.h"

namespace sluice {

namespace {

using nlohmann::json;

// Values of a tensor, made when the file is written.
using Values = std::function<std::vector<float>()>;

// `count` values of `t` from value `first`, in fp32; their pages of the mapping dropped.
std::vector<float> floats_of(const TensorEntry& t, int64_t first, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  const size_t bytes = dtype_size(t.dtype);
  const auto* src =
      reinterpret_cast<const uint8_t*>(t.file->data()) + t.offset + size_t(first) * bytes;
  constexpr int64_t kChunk = 1 << 20;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; i += kChunk)
    to_f32(t.dtype, src + size_t(i) * bytes, out.data() + i, size_t(std::min(kChunk, count - i)));
  // Read once: its pages leave this process, so a model larger than memory is exported.
  t.file->drop_pages(t.offset + size_t(first) * bytes, size_t(count) * bytes);
  return out;
}

std::vector<float> floats_of(const TensorEntry& t) {
  return floats_of(t, 0, shape_numel(t.shape));
}

// An FP8 weight as llama.cpp's converter dequantises it (dequant_simple): each code times its
// 128 × 128 block's weight_scale_inv, in fp32.
std::vector<float> dequantized_fp8(const Checkpoint& ckpt, const TensorEntry& t) {
  std::vector<float> out = floats_of(t);
  const std::vector<float> scale = floats_of(*ckpt.find(fp8_scale_name(t.name)));
  const int64_t n = t.shape[0], k = t.shape[1], blocks = fp8_scale_shape(n, k)[1];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      out[size_t(i * k + j)] *= scale[size_t(i / 128 * blocks + j / 128)];
  return out;
}

uint32_t stored_type(const Shape& shape, GgufWeights weights) {
  if (stored_quantized(shape) && weights == GgufWeights::kQ8_0) return uint32_t(GgmlType::Q8_0);
  if (stored_quantized(shape) && weights == GgufWeights::kQ4_0) return uint32_t(GgmlType::Q4_0);
  if (weights == GgufWeights::kBF16 && shape.size() > 1) return uint32_t(GgmlType::BF16);
  return uint32_t(GgmlType::F32);
}

size_t stored_bytes(uint32_t type, int64_t values) {
  const GgmlTypeInfo info = *ggml_type_info(type);
  return size_t(values / info.block_elements) * info.block_bytes;
}

// `x` in ggml type `type`, appended to `out`; in chunks of whole blocks across the threads.
void encode(const std::vector<float>& x, uint32_t type, std::vector<uint8_t>& out) {
  const int64_t n = int64_t(x.size());
  const size_t at = out.size();
  out.resize(at + stored_bytes(type, n));
  uint8_t* dst = out.data() + at;
  constexpr int64_t kChunk = 1 << 16;  // a multiple of 32
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    if (type == uint32_t(GgmlType::Q8_0)) {
      quantize_q8_0(x.data() + i, len, dst + stored_bytes(type, i));
    } else if (type == uint32_t(GgmlType::Q4_0)) {
      quantize_q4_0(x.data() + i, len, dst + stored_bytes(type, i));
    } else if (type == uint32_t(GgmlType::BF16)) {
      for (int64_t j = i; j < i + len; ++j) {
        const uint16_t h = f32_to_bf16(x[size_t(j)]);
        std::memcpy(dst + 2 * j, &h, 2);
      }
    } else {
      std::memcpy(dst + 4 * i, x.data() + i, size_t(len) * 4);
    }
  }
}

// The tokenizer of the folder as llama.cpp's "gpt2" vocabulary (tokens in id order, merges,
// control tokens, bos/eos, the chat template and the pre-tokenizer's name). As its converter
// does (get_vocab_base), the list has exactly config.json's vocab_size entries, ids the tokenizer
// lacks written as "[PAD<id>]" of type UNUSED: llama.cpp refuses a file whose token count is not
// token_embd's rows, as make-model's folders (a 361-token tokenizer under a vocabulary of 32000)
// and released models with padded embeddings have.
void add_tokenizer(const std::filesystem::path& dir, const ModelConfig& c, GgufWriter& w) {
  const std::filesystem::path path = dir / "tokenizer.json";
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot read the tokenizer the GGUF file must hold");
  const json tok = json::parse(in);
  std::map<int64_t, std::string> by_id;
  for (const auto& [text, id] : tok["model"]["vocab"].items()) by_id[id.get<int64_t>()] = text;
  std::map<int64_t, bool> special;
  for (const auto& a : tok["added_tokens"]) {
    by_id[a["id"].get<int64_t>()] = a["content"].get<std::string>();
    special[a["id"].get<int64_t>()] = true;
  }
  if (by_id.empty()) throw Error(path.string() + ": the tokenizer has no tokens");
  if (by_id.rbegin()->first >= c.vocab_size)
    throw Error(fmt::format("{}: token id {} is not below config.json's vocab_size {}",
                            path.string(), by_id.rbegin()->first, c.vocab_size));
  json tokens = json::array(), types = json::array();
  for (int64_t id = 0; id < c.vocab_size; ++id) {
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

void add_value(GgufWriter& w, const std::string& key, const json& v) {
  if (v.is_boolean())
    w.add(key, GgufType::kBool, v);
  else if (v.is_number_integer())
    w.add(key, GgufType::kU32, v);
  else if (v.is_number())
    w.add(key, GgufType::kF32, v);
}

void add_u32(GgufWriter& w, const std::string& key, int64_t v) {
  w.add(key, GgufType::kU32, v);
}

void add_f32(GgufWriter& w, const std::string& key, double v) {
  w.add(key, GgufType::kF32, v);
}

// The metadata llama.cpp's converter writes: "{arch}.*" from config.json through the family's
// keys (a key whose value the arch implies anyway is left out, as the converter does).
void add_llama_style_metadata(const ModelConfig& c, const GgufNaming& naming, GgufWriter& w) {
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
void add_dbrx_metadata(const ModelConfig& c, GgufWriter& w) {
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
void add_deepseek2_metadata(const ModelConfig& c, GgufWriter& w) {
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

void add_metadata(const ModelConfig& c, const GgufNaming& naming, const std::string& name,
                  GgufWriter& w) {
  w.add("general.architecture", GgufType::kString, naming.arch);
  w.add("general.name", GgufType::kString, name);
  const std::string arch = naming.arch;
  if (arch == "dbrx")
    add_dbrx_metadata(c, w);
  else if (arch == "deepseek2")
    add_deepseek2_metadata(c, w);
  else
    add_llama_style_metadata(c, naming, w);
}

// A GGUF tensor to write: its values are its parts' (the experts of a stacked tensor), in order.
struct ExportTensor {
  Shape shape;  // row-major
  std::vector<Values> parts;
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

// The values of checkpoint tensor `t` as the file holds them: FP8 dequantised, q/k rows
// permuted where the naming says.
Values values_of(const std::shared_ptr<const Checkpoint>& ckpt, const TensorEntry* t, GgufRows rows,
                 const GgufNaming& naming, const ModelConfig& c) {
  const bool permuted = naming.interleaved_qk && rows != GgufRows::kAsIs;
  const int64_t heads = rows == GgufRows::kQueryHeads ? c.num_heads : c.num_kv_heads;
  const int64_t head_dim = c.head_dim;
  return [ckpt, t, permuted, heads, head_dim] {
    std::vector<float> x = t->dtype == DType::F8_E4M3 ? dequantized_fp8(*ckpt, *t) : floats_of(*t);
    if (!permuted) return x;
    const size_t row_bytes = x.size() * 4 / size_t(heads * head_dim);
    const std::vector<uint8_t> p = permute_qk_rows(x.data(), heads, head_dim, row_bytes);
    std::memcpy(x.data(), p.data(), p.size());
    return x;
  };
}

// DbrxModel.modify_tensors: a flat [E·ffn, hidden] expert tensor viewed [E, ffn, hidden], w2
// (ffn_down_exps) permuted (0, 2, 1) to [E, hidden, ffn]; one part per expert.
ExportTensor stacked_dbrx_experts(const TensorEntry* t, bool down, const ModelConfig& c) {
  const int64_t E = c.num_experts, I = c.expert_intermediate_size, H = c.hidden_size;
  ExportTensor out{down ? Shape{E, H, I} : Shape{E, I, H}, {}};
  for (int64_t e = 0; e < E; ++e)
    out.parts.push_back([t, e, I, H, down] {
      std::vector<float> x = floats_of(*t, e * I * H, I * H);
      if (!down) return x;
      std::vector<float> y(x.size());
      for (int64_t i = 0; i < I; ++i)
        for (int64_t h = 0; h < H; ++h) y[size_t(h * I + i)] = x[size_t(i * H + h)];
      return y;
    });
  return out;
}

std::map<std::string, ExportTensor> gather(const std::shared_ptr<const Checkpoint>& ckpt,
                                           const GgufNaming& naming, const ModelConfig& c) {
  static const std::regex expert(R"(\.experts\.(\d+)\.)");
  std::map<std::string, ExportTensor> out;
  for (const auto& [name, entry] : ckpt->tensors()) {
    if (left_out(name, naming, c)) continue;
    const GgufName gn = gguf_tensor_name(naming, name);
    if (gn.name.empty()) throw Error("no GGUF name for " + name);
    ExportTensor& t = out[gn.name];
    std::smatch m;
    if (std::regex_search(name, m, expert)) {
      const size_t e = std::stoul(m[1]);
      if (t.parts.size() <= e) t.parts.resize(e + 1);
      t.parts[e] = values_of(ckpt, &entry, gn.rows, naming, c);
      t.shape = entry.shape;
      t.shape.insert(t.shape.begin(), int64_t(t.parts.size()));
    } else if (c.family == Family::Dbrx && gn.name.ends_with("_exps.weight")) {
      t = stacked_dbrx_experts(&entry, gn.name.ends_with("ffn_down_exps.weight"), c);
    } else {
      t = {entry.shape, {values_of(ckpt, &entry, gn.rows, naming, c)}};
    }
  }
  return out;
}

// DeepseekV2Model.modify_tensors: kv_b_proj viewed [heads, qk_nope + v, R] and split into
// attn_k_b (the k rows, transposed to [heads, R, qk_nope]) and attn_v_b [heads, v, R].
void split_latent_kv(std::map<std::string, ExportTensor>& tensors, const ModelConfig& c) {
  const int64_t heads = c.num_heads, R = c.mla.kv_lora_rank, nope = c.mla.qk_nope_head_dim,
                v = c.mla.v_head_dim;
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors)
    if (name.ends_with("attn_kv_b.weight")) names.push_back(name);
  for (const std::string& name : names) {
    const Values kv = tensors[name].parts[0];
    const Values k = [=] {
      const std::vector<float> x = kv();
      std::vector<float> out(size_t(heads * R * nope));
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < nope; ++i)
          for (int64_t r = 0; r < R; ++r)
            out[size_t((h * R + r) * nope + i)] = x[size_t((h * (nope + v) + i) * R + r)];
      return out;
    };
    const Values vb = [=] {
      const std::vector<float> x = kv();
      std::vector<float> out(size_t(heads * v * R));
      for (int64_t h = 0; h < heads; ++h)
        std::copy_n(x.data() + (h * (nope + v) + nope) * R, v * R, out.data() + h * v * R);
      return out;
    };
    const std::string stem = name.substr(0, name.size() - std::string("kv_b.weight").size());
    tensors[stem + "k_b.weight"] = {{heads, R, nope}, {k}};
    tensors[stem + "v_b.weight"] = {{heads, v, R}, {vb}};
    tensors.erase(name);
  }
}

void add_tensor(GgufWriter& w, const std::string& name, const ExportTensor& t,
                GgufWeights weights) {
  const uint32_t type = stored_type(t.shape, weights);
  w.add_tensor(name, type, Shape(t.shape.rbegin(), t.shape.rend()),
               stored_bytes(type, shape_numel(t.shape)),
               [parts = t.parts, type](const GgufWriter::Sink& sink) {
                 std::vector<uint8_t> bytes;
                 for (const Values& part : parts) {
                   bytes.clear();
                   encode(part(), type, bytes);
                   sink(bytes.data(), bytes.size());
                 }
               });
}

}  // namespace

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

GgufWeights parse_gguf_weights(const std::string& s, const std::string& what) {
  std::string upper = s;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char ch) { return char(std::toupper(ch)); });
  for (GgufWeights w :
       {GgufWeights::kF32, GgufWeights::kBF16, GgufWeights::kQ8_0, GgufWeights::kQ4_0})
    if (upper == gguf_weights_name(w)) return w;
  throw Error(
      fmt::format("{}: '{}' is not a GGUF weight type; expected f32, bf16, q8_0 or q4_0", what, s));
}

bool stored_quantized(const Shape& shape) {
  return shape.size() >= 2 && shape.back() % 32 == 0;
}

std::filesystem::path export_gguf(const std::filesystem::path& hf_dir,
                                  const std::filesystem::path& out, GgufWeights weights, int parts,
                                  const std::function<void(GgufWriter&)>& edit,
                                  GgufLatentKv latent_kv) {
  const ModelConfig c = load_config(hf_dir / "config.json");
  if (!family_spec(c.family).gguf)
    throw Error(fmt::format("{}: family {} has no GGUF naming", hf_dir.string(),
                            family_spec(c.family).model_type));
  const GgufNaming& naming = *family_spec(c.family).gguf;
  const auto ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(hf_dir));
  std::vector<GgufWriter> writers(static_cast<size_t>(parts));
  add_metadata(c, naming, hf_dir.filename().string(), writers[0]);
  add_tokenizer(hf_dir, c, writers[0]);

  auto tensors = gather(ckpt, naming, c);
  if (c.attention == AttentionKind::kLatent && latent_kv == GgufLatentKv::kSplit)
    split_latent_kv(tensors, c);
  size_t index = 0;
  for (const auto& [name, t] : tensors)
    add_tensor(writers[index++ % size_t(parts)], name, t, weights);
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

}  // namespace sluice
