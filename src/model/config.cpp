#include "model/config.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sluice {

using nlohmann::json;

std::string_view family_name(Family f) {
  switch (f) {
    case Family::Mixtral:
      return "mixtral";
  }
  return "unknown";
}

namespace {

// Reads config fields with errors that name the file, the field and the expected type.
class ConfigReader {
 public:
  ConfigReader(const json& j, const std::string& source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int integer(const char* key) const {
    require(key);
    return positive_int(key, j_[key]);
  }
  int integer_or(const char* key, int fallback) const {
    return has(key) ? positive_int(key, j_[key]) : fallback;
  }
  float number_or(const char* key, float fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_number()) wrong_type(key, "a number");
    return j_[key].get<float>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) wrong_type(key, "true or false");
    return j_[key].get<bool>();
  }
  std::vector<int> ids_or_empty(const char* key) const {
    if (!has(key)) return {};
    const json& v = j_[key];
    if (v.is_number_integer()) return {v.get<int>()};
    if (!v.is_array()) wrong_type(key, "an integer or a list of integers");
    std::vector<int> ids;
    for (const auto& x : v) {
      if (!x.is_number_integer()) wrong_type(key, "an integer or a list of integers");
      ids.push_back(x.get<int>());
    }
    return ids;
  }
  [[noreturn]] void wrong_type(const char* key, const char* expected) const {
    fail("{}: field '{}': expected {}, got {}", source_, key, expected, j_[key].dump());
  }

 private:
  void require(const char* key) const {
    if (!has(key)) fail("{}: required field '{}' is missing", source_, key);
  }
  int positive_int(const char* key, const json& v) const {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1ll << 31) - 1)
      wrong_type(key, "a positive integer");
    return v.get<int>();
  }
  const json& j_;
  const std::string& source_;
};

struct KnownArchitecture {
  const char* architecture;
  const char* model_type;
  Family family;
};
constexpr KnownArchitecture kArchitectures[] = {
    {"MixtralForCausalLM", "mixtral", Family::Mixtral},
};

Family detect_family(const json& j, const std::string& source, std::string* architecture) {
  std::string arch, model_type;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0];
  if (j.contains("model_type") && j["model_type"].is_string()) model_type = j["model_type"];
  for (const auto& k : kArchitectures) {
    if (arch == k.architecture || (arch.empty() && model_type == k.model_type)) {
      *architecture = k.architecture;
      return k.family;
    }
  }
  std::string supported;
  for (const auto& k : kArchitectures)
    supported += std::string(supported.empty() ? "" : ", ") + k.architecture;
  fail("{}: unsupported architecture '{}' (model_type '{}'); supported: {}", source,
       arch.empty() ? "(none)" : arch, model_type, supported);
}

}  // namespace

ModelConfig parse_config(const json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: expected a JSON object at the top level", source);
  ConfigReader r(j, source);
  ModelConfig c;
  c.family = detect_family(j, source, &c.architecture);
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.num_layers = r.integer("num_hidden_layers");
  c.num_heads = r.integer("num_attention_heads");
  // As MixtralConfig: an absent field takes the class default 8; an explicit null means one KV
  // head per query head (its __post_init__).
  if (!j.contains("num_key_value_heads"))
    c.num_kv_heads = 8;
  else
    c.num_kv_heads = r.integer_or("num_key_value_heads", c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    fail("{}: field 'num_attention_heads' ({}) must be a multiple of 'num_key_value_heads' ({})",
         source, c.num_heads, c.num_kv_heads);
  if (r.has("head_dim")) {
    c.head_dim = r.integer("head_dim");
  } else {
    if (c.hidden_size % c.num_heads != 0)
      fail(
          "{}: 'hidden_size' ({}) is not divisible by 'num_attention_heads' ({}) and no "
          "'head_dim' is given",
          source, c.hidden_size, c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0)
    fail("{}: field 'head_dim': expected an even number for RoPE, got {}", source, c.head_dim);
  c.expert_intermediate_size = r.integer("intermediate_size");
  c.num_experts = r.integer("num_local_experts");
  c.experts_per_token = r.integer("num_experts_per_tok");
  if (c.experts_per_token > c.num_experts)
    fail("{}: field 'num_experts_per_tok' ({}) exceeds 'num_local_experts' ({})", source,
         c.experts_per_token, c.num_experts);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-5f);
  c.max_position_embeddings =
      r.integer_or("max_position_embeddings", 4096 * 32);  // MixtralConfig default
  c.sliding_window = r.integer_or("sliding_window", 0);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);

  // RoPE: `rope_theta` at the top level (transformers 4.x) or inside `rope_parameters` (5.x).
  // Only the default rope type is Mixtral's; scaled variants come with the families using them.
  c.rope_theta = r.number_or("rope_theta", 1e6f);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!r.has(key)) continue;
    const json& rope = j[key];
    if (!rope.is_object()) r.wrong_type(key, "an object");
    std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
    if (type != "default")
      fail("{}: field '{}': rope type '{}' is not supported for {}; expected 'default'", source,
           key, type, c.architecture);
    if (rope.contains("rope_theta")) {
      if (!rope["rope_theta"].is_number())
        fail("{}: field '{}.rope_theta': expected a number", source, key);
      c.rope_theta = rope["rope_theta"].get<float>();
    }
  }
  if (!(c.rope_theta > 0)) fail("{}: field 'rope_theta': expected a positive number", source);
  if (!(c.rms_norm_eps > 0)) fail("{}: field 'rms_norm_eps': expected a positive number", source);

  if (r.has("hidden_act")) {
    if (!j["hidden_act"].is_string() || j["hidden_act"] != "silu")
      fail("{}: field 'hidden_act': expected \"silu\", got {}", source, j["hidden_act"].dump());
  }
  auto bos = r.ids_or_empty("bos_token_id");
  c.bos_token_id = bos.empty() ? -1 : bos[0];
  c.eos_token_ids = r.ids_or_empty("eos_token_id");

  std::string dtype = j.value("torch_dtype", j.value("dtype", std::string("bfloat16")));
  if (dtype == "bfloat16")
    c.dtype = DType::BF16;
  else if (dtype == "float16")
    c.dtype = DType::F16;
  else if (dtype == "float32")
    c.dtype = DType::F32;
  else
    fail("{}: field 'torch_dtype': expected bfloat16, float16 or float32, got '{}'", source, dtype);
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
  const char* dtype = c.dtype == DType::BF16  ? "bfloat16"
                      : c.dtype == DType::F16 ? "float16"
                                              : "float32";
  json j = {
      {"architectures", {c.architecture}},
      {"model_type", std::string(family_name(c.family))},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.expert_intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"sliding_window", c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr)},
      {"num_local_experts", c.num_experts},
      {"num_experts_per_tok", c.experts_per_token},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id",
       c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids)},
      {"torch_dtype", dtype},
      {"router_aux_loss_coef", 0.02},
      {"output_router_logits", false},
      {"use_cache", true},
  };
  return j;
}

}  // namespace sluice
