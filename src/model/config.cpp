#include "model/config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_number.h"
#include "model/config_reader.h"
#include "model/expert_quant.h"
#include "model/family.h"
#include "model/fp8_weights.h"

namespace sluice {

using nlohmann::json;

std::string_view family_name(Family f) {
  return family_spec(f).model_type;
}

bool ModelConfig::is_moe_layer(int layer) const {
  return num_experts > 0 &&
         std::find(dense_layers.begin(), dense_layers.end(), layer) == dense_layers.end();
}

namespace {

// yarn_get_mscale: 0.1 · mscale · ln(scale) + 1, or 1 when scale <= 1.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

float ModelConfig::attention_scale() const {
  // DeepseekV3Attention: scaling *= mscale² with mscale = yarn_get_mscale(factor,
  // mscale_all_dim) when rope_scaling has a (non-zero) mscale_all_dim (in double, as Python).
  if (rope_scaling.kind != RopeScalingKind::kNone && rope_scaling.mscale_all_dim > 0) {
    const double m = yarn_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    return float(m * m / std::sqrt(double(head_dim)));
  }
  // Without it, the fp32 expression the engine's kernels use, bit for bit.
  return 1.0f / std::sqrt(float(head_dim));
}

// inv_freq = 1 / theta^(arange(0, d, 2) / d) over the d = rope_dim() rotated values, all fp32
// as the rotary embeddings compute it; with YaRN, transformers' _compute_yarn_parameters: the
// original and the factor-interpolated frequencies blended by a linear ramp between the
// dimensions that make beta_fast and beta_slow rotations over the original context.
std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int d = c.rope_dim(), half = d / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv[size_t(i)] = 1.0f / std::pow(c.rope_theta, float(2 * i) / float(d));
  const RopeScaling& y = c.rope_scaling;
  if (y.kind != RopeScalingKind::kYarn) return inv;
  const double base = c.rope_theta;
  const double original = y.original_max_position_embeddings > 0
                              ? y.original_max_position_embeddings
                              : c.max_position_embeddings;
  auto correction_dim = [&](double rotations) {
    return double(d) * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(d - 1));
  if (low == high) high += 0.001;  // prevent a singular ramp
  for (int i = 0; i < half; ++i) {
    const float pos_freq = std::pow(c.rope_theta, float(2 * i) / float(d));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (y.factor * pos_freq);
    const float ramp = std::clamp((float(i) - float(low)) / float(high - low), 0.0f, 1.0f);
    const float extrapolation_share = 1.0f - ramp;
    inv[size_t(i)] =
        interpolation * (1.0f - extrapolation_share) + extrapolation * extrapolation_share;
  }
  return inv;
}

int64_t ModelConfig::attention_weight_elements() const {
  const int64_t H = hidden_size;
  if (attention != AttentionKind::kLatent) return H * q_dim() * 2 + H * kv_dim() * 2;
  const int64_t heads = num_heads, R = mla.kv_lora_rank, P = mla.qk_rope_head_dim;
  const int64_t q = mla.q_lora_rank > 0 ? int64_t(mla.q_lora_rank) * (H + heads * head_dim)
                                        : H * heads * head_dim;
  return q + (R + P) * H + heads * (mla.qk_nope_head_dim + mla.v_head_dim) * R +
         H * heads * mla.v_head_dim;
}

float ModelConfig::rope_attention_factor() const {
  const RopeScaling& y = rope_scaling;
  if (y.kind != RopeScalingKind::kYarn) return 1.f;
  if (y.attention_factor > 0) return y.attention_factor;
  if (y.mscale > 0 && y.mscale_all_dim > 0)
    return float(yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim));
  return float(yarn_mscale(y.factor, 1.0));
}

int ModelConfig::dense_mlp_size(int layer) const {
  return is_moe_layer(layer) ? shared_expert_intermediate_size : dense_intermediate_size;
}

// ---------------------------------------------------------------------------------------------
// ConfigReader

void ConfigReader::require(const char* key) const {
  if (!has(key)) fail("{}: required field '{}{}' is missing", source_, prefix_, key);
}

int ConfigReader::positive_int(const char* key, const json& v) const {
  const auto i = json_integer(v, 1, INT_MAX);
  if (!i) wrong_type(key, "a positive integer");
  return int(*i);
}

int ConfigReader::integer(const char* key) const {
  require(key);
  return positive_int(key, j_[key]);
}

int ConfigReader::integer_or(const char* key, int fallback) const {
  return has(key) ? positive_int(key, j_[key]) : fallback;
}

int ConfigReader::count_or(const char* key, int fallback) const {
  if (!present(key)) return fallback;
  const auto i = json_integer(j_[key], 0, INT_MAX);
  if (!i) wrong_type(key, "an integer >= 0");
  return int(*i);
}

float ConfigReader::number_or(const char* key, float fallback) const {
  if (!has(key)) return fallback;
  const auto f = json_float(j_[key]);
  if (!f) wrong_type(key, "a finite number");
  return *f;
}

bool ConfigReader::boolean_or(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  if (!j_[key].is_boolean()) wrong_type(key, "true or false");
  return j_[key].get<bool>();
}

std::string ConfigReader::string_or(const char* key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  if (!j_[key].is_string()) wrong_type(key, "a string");
  return j_[key].get<std::string>();
}

std::vector<int> ConfigReader::ids_or_empty(const char* key) const {
  if (!has(key)) return {};
  const json& v = j_[key];
  const auto id = [&](const json& x) {
    const auto i = json_integer(x, INT_MIN, INT_MAX);
    if (!i) wrong_type(key, "an integer or a list of integers");
    return int(*i);
  };
  if (!v.is_array()) return {id(v)};
  std::vector<int> ids;
  for (const auto& x : v) ids.push_back(id(x));
  return ids;
}

std::vector<int> ConfigReader::indices_or_empty(const char* key) const {
  if (!has(key)) return {};
  const json& v = j_[key];
  if (!v.is_array()) wrong_type(key, "a list of layer indices");
  std::vector<int> out;
  for (const auto& x : v) {
    const auto i = json_integer(x, 0, INT_MAX);
    if (!i) wrong_type(key, "a list of layer indices");
    out.push_back(int(*i));
  }
  return out;
}

ConfigReader ConfigReader::object(const char* key) const {
  require(key);
  if (!j_[key].is_object()) wrong_type(key, "an object");
  return ConfigReader(j_[key], source_, prefix_ + key + ".");
}

void ConfigReader::wrong_type(const char* key, const char* expected) const {
  fail("{}: field '{}{}': expected {}, got {}", source_, prefix_, key, expected,
       j_.contains(key) ? j_[key].dump() : std::string("nothing"));
}

// ---------------------------------------------------------------------------------------------
// The Llama-style fields.

namespace {

void read_heads(const ConfigReader& r, const LlamaStyleDefaults& d, ModelConfig& c) {
  c.num_heads = r.integer("num_attention_heads");
  // An absent field takes the class default; an explicit null means one KV head per query head
  // (the configs' __post_init__).
  if (!r.present("num_key_value_heads"))
    c.num_kv_heads = d.num_kv_heads > 0 ? d.num_kv_heads : c.num_heads;
  else
    c.num_kv_heads = r.integer_or("num_key_value_heads", c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    fail("{}: field 'num_attention_heads' ({}) must be a multiple of 'num_key_value_heads' ({})",
         r.source(), c.num_heads, c.num_kv_heads);
  if (d.head_dim_field && r.has("head_dim")) {
    c.head_dim = r.integer("head_dim");
    return;
  }
  if (c.hidden_size % c.num_heads != 0)
    fail("{}: 'hidden_size' ({}) is not divisible by 'num_attention_heads' ({}){}", r.source(),
         c.hidden_size, c.num_heads, d.head_dim_field ? " and no 'head_dim' is given" : "");
  c.head_dim = c.hidden_size / c.num_heads;
  if (r.has("head_dim") && r.integer("head_dim") != c.head_dim)
    r.fail_field("head_dim",
                 "{} computes head_dim as hidden_size / num_attention_heads = {}, but the file "
                 "says {}",
                 c.architecture, c.head_dim, r.integer("head_dim"));
}

float positive_number(const ConfigReader& r, const char* object, const json& rope, const char* key,
                      float fallback) {
  if (!rope.contains(key) || rope[key].is_null()) return fallback;
  const auto f = json_float(rope[key]);
  if (!f || !(*f > 0))
    fail("{}: field '{}.{}': expected a positive number, got {}", r.source(), object, key,
         json_excerpt(rope[key]));
  return *f;
}

// YaRN's fields as _compute_yarn_parameters reads them (factor required; beta_fast and
// beta_slow default to 32 and 1; original_max_position_embeddings to max_position_embeddings).
RopeScaling read_yarn(const ConfigReader& r, const char* key, const json& rope) {
  RopeScaling s;
  s.kind = RopeScalingKind::kYarn;
  if (!rope.contains("factor"))
    fail("{}: field '{}.factor': required by rope type 'yarn'", r.source(), key);
  s.factor = positive_number(r, key, rope, "factor", 1.f);
  s.beta_fast = positive_number(r, key, rope, "beta_fast", 32.f);
  s.beta_slow = positive_number(r, key, rope, "beta_slow", 1.f);
  s.mscale = positive_number(r, key, rope, "mscale", 0.f);
  s.mscale_all_dim = positive_number(r, key, rope, "mscale_all_dim", 0.f);
  s.attention_factor = positive_number(r, key, rope, "attention_factor", 0.f);
  s.original_max_position_embeddings =
      int(positive_number(r, key, rope, "original_max_position_embeddings", 0.f));
  if (rope.contains("truncate")) {
    if (!rope["truncate"].is_boolean())
      fail("{}: field '{}.truncate': expected true or false", r.source(), key);
    s.truncate = rope["truncate"].get<bool>();
  }
  return s;
}

// `rope_theta` at the top level (transformers 4.x) or inside `rope_parameters` (5.x). The
// default rope type and YaRN are implemented.
void read_rope(const ConfigReader& r, float fallback, bool yarn, ModelConfig& c) {
  c.rope_theta = r.number_or("rope_theta", fallback);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!r.has(key)) continue;
    const json& rope = r.doc()[key];
    if (!rope.is_object()) r.wrong_type(key, "an object");
    std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
    if (yarn && type == "yarn")
      c.rope_scaling = read_yarn(r, key, rope);
    else if (type != "default")
      fail("{}: field '{}': rope type '{}' is not supported for {}; expected 'default'{}",
           r.source(), key, type, c.architecture, yarn ? " or 'yarn'" : "");
    if (rope.contains("rope_theta")) {
      const auto theta = json_float(rope["rope_theta"]);
      if (!theta) fail("{}: field '{}.rope_theta': expected a finite number", r.source(), key);
      c.rope_theta = *theta;
    }
  }
}

}  // namespace

DType read_dtype(const ConfigReader& r) {
  const json& j = r.doc();
  std::string dtype = j.value("torch_dtype", j.value("dtype", std::string("bfloat16")));
  if (dtype == "bfloat16") return DType::BF16;
  if (dtype == "float16") return DType::F16;
  if (dtype == "float32") return DType::F32;
  fail("{}: field 'torch_dtype': expected bfloat16, float16 or float32, got '{}'", r.source(),
       dtype);
}

const char* dtype_json_name(DType t) {
  return t == DType::BF16 ? "bfloat16" : t == DType::F16 ? "float16" : "float32";
}

void read_llama_style(const ConfigReader& r, const LlamaStyleDefaults& d, ModelConfig& c) {
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.num_layers = r.integer("num_hidden_layers");
  read_heads(r, d, c);
  c.rms_norm_eps = r.number_or("rms_norm_eps", d.rms_norm_eps);
  c.max_position_embeddings = r.integer_or("max_position_embeddings", d.max_position_embeddings);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  read_rope(r, d.rope_theta, d.yarn, c);
  if (r.has("hidden_act") && r.string_or("hidden_act", "") != "silu")
    r.wrong_type("hidden_act", "\"silu\"");
  auto bos = r.ids_or_empty("bos_token_id");
  c.bos_token_id = bos.empty() ? -1 : bos[0];
  c.eos_token_ids = r.ids_or_empty("eos_token_id");
  c.dtype = read_dtype(r);
}

void write_llama_style(const ModelConfig& c, json& j) {
  j["architectures"] = {c.architecture};
  j["model_type"] = std::string(family_name(c.family));
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  j["eos_token_id"] =
      c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids);
  j["torch_dtype"] = dtype_json_name(c.dtype);
  j["use_cache"] = true;
  const RopeScaling& y = c.rope_scaling;
  if (y.kind == RopeScalingKind::kYarn) {
    json rope = {{"type", "yarn"},           {"factor", y.factor},
                 {"beta_fast", y.beta_fast}, {"beta_slow", y.beta_slow},
                 {"mscale", y.mscale},       {"mscale_all_dim", y.mscale_all_dim}};
    if (y.original_max_position_embeddings > 0)
      rope["original_max_position_embeddings"] = y.original_max_position_embeddings;
    if (y.attention_factor > 0) rope["attention_factor"] = y.attention_factor;
    if (!y.truncate) rope["truncate"] = false;
    j["rope_scaling"] = rope;
  }
}

void read_qwen_dense_layers(const ConfigReader& r, ModelConfig& c) {
  const int step = r.integer_or("decoder_sparse_step", 1);
  const std::vector<int> only = r.indices_or_empty("mlp_only_layers");
  for (int l : only)
    if (l >= c.num_layers)
      r.fail_field("mlp_only_layers", "layer {} is outside the model's {} layers", l, c.num_layers);
  c.dense_layers.clear();
  for (int l = 0; l < c.num_layers; ++l)
    if (std::find(only.begin(), only.end(), l) != only.end() || (l + 1) % step != 0)
      c.dense_layers.push_back(l);
}

void check_common(const ConfigReader& r, const ModelConfig& c) {
  if (c.attention == AttentionKind::kMultiHead && c.head_dim % 2 != 0)
    fail("{}: field 'head_dim': expected an even number for RoPE, got {}", r.source(), c.head_dim);
  if (c.experts_per_token > c.num_experts)
    fail("{}: field 'num_experts_per_tok' ({}) exceeds the number of experts ({})", r.source(),
         c.experts_per_token, c.num_experts);
  if (!(c.rope_theta > 0)) fail("{}: field 'rope_theta': expected a positive number", r.source());
  if (!(c.rms_norm_eps > 0))
    fail("{}: field 'rms_norm_eps': expected a positive number", r.source());
  if (c.clip_qkv < 0) fail("{}: field 'clip_qkv': expected a positive number", r.source());
  for (int l = 0; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l) && c.dense_intermediate_size <= 0)
      fail("{}: layer {} has a dense MLP but its size 'intermediate_size' is not given", r.source(),
           l);
}

// ---------------------------------------------------------------------------------------------

namespace {

const FamilySpec& detect_family(const json& j, const std::string& source) {
  std::string arch, model_type;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0];
  if (j.contains("model_type") && j["model_type"].is_string()) model_type = j["model_type"];
  for (const FamilySpec* f : all_families())
    if (arch == f->architecture || (arch.empty() && model_type == f->model_type)) return *f;
  std::string supported;
  for (const FamilySpec* f : all_families())
    supported += std::string(supported.empty() ? "" : ", ") + f->architecture;
  fail("{}: unsupported architecture '{}' (model_type '{}'); supported: {}", source,
       arch.empty() ? "(none)" : arch, model_type, supported);
}

}  // namespace

ModelConfig parse_config(const json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: expected a JSON object at the top level", source);
  ConfigReader r(j, source);
  const FamilySpec& spec = detect_family(j, source);
  ModelConfig c;
  c.family = spec.family;
  c.architecture = spec.architecture;
  spec.read_config(r, c);
  check_common(r, c);
  read_quantization_field(j, source, c);
  read_fp8_quantization_config(j, source, c);
  return c;
}

ModelConfig load_config(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open config", path.string());
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) fail("{}: not valid JSON", path.string());
  return parse_config(j, path.string());
}

json config_to_json(const ModelConfig& c) {
  json j = json::object();
  family_spec(c.family).write_config(c, j);
  write_quantization_field(c, j);
  write_fp8_quantization_config(c, j);
  return j;
}

}  // namespace sluice
