// Reads config.json fields with errors that name the file, the field and what was expected.
// Shared by the families' readers (family_*.cpp).
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"

namespace sluice {

class ConfigReader {
 public:
  // `prefix` names a nested object in messages ("attn_config." for DBRX's).
  ConfigReader(const nlohmann::json& j, const std::string& source, std::string prefix = "")
      : j_(j), source_(source), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  bool present(const char* key) const { return j_.contains(key); }  // null counts
  const nlohmann::json& doc() const { return j_; }
  const std::string& source() const { return source_; }

  int integer(const char* key) const;
  int integer_or(const char* key, int fallback) const;
  float number_or(const char* key, float fallback) const;
  bool boolean_or(const char* key, bool fallback) const;
  std::string string_or(const char* key, const std::string& fallback) const;
  // An integer >= 0; `fallback` when absent (an explicit null is an error).
  int count_or(const char* key, int fallback) const;
  std::vector<int> ids_or_empty(const char* key) const;      // an integer or a list of them
  std::vector<int> indices_or_empty(const char* key) const;  // a list of integers >= 0
  // The nested object `key` (an error when it is absent or not an object).
  ConfigReader object(const char* key) const;

  [[noreturn]] void wrong_type(const char* key, const char* expected) const;
  // "<source>: field '<prefix><key>': <message>".
  template <typename... Args>
  [[noreturn]] void fail_field(const char* key, fmt::format_string<Args...> message,
                               Args&&... args) const {
    fail("{}: field '{}{}': {}", source_, prefix_, key,
         fmt::format(message, std::forward<Args>(args)...));
  }

 private:
  void require(const char* key) const;
  int positive_int(const char* key, const nlohmann::json& v) const;
  const nlohmann::json& j_;
  const std::string& source_;
  std::string prefix_;
};

// How a Llama-style config.json (Mixtral, Qwen2/3-MoE, OLMoE) spells its common fields, and the
// class defaults its transformers config applies to absent ones.
struct LlamaStyleDefaults {
  int num_kv_heads = 0;  // an absent num_key_value_heads; 0: one per query head
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.f;
  int max_position_embeddings = 4096;
  bool head_dim_field = true;  // false: head_dim is hidden_size / heads whatever the file says
  // YaRN rope scaling accepted (DeepSeek, whose attention also applies mscale_all_dim to the
  // softmax scale); otherwise only the default rope type.
  bool yarn = false;
};

// vocab_size, hidden_size, num_hidden_layers, attention heads and head_dim, rms_norm_eps, RoPE
// (rope_theta, rope_scaling, rope_parameters), max_position_embeddings, tie_word_embeddings,
// hidden_act, bos/eos ids and torch_dtype.
void read_llama_style(const ConfigReader& r, const LlamaStyleDefaults& d, ModelConfig& c);
// The same fields as config_to_json writes them.
void write_llama_style(const ModelConfig& c, nlohmann::json& j);

// Qwen's dense-layer rule: layer l has the MoE block unless it is in mlp_only_layers or
// (l + 1) % decoder_sparse_step != 0. Reads both fields into c.dense_layers.
void read_qwen_dense_layers(const ConfigReader& r, ModelConfig& c);

// torch_dtype (or dtype): bfloat16 (when absent), float16 or float32; and as written.
DType read_dtype(const ConfigReader& r);
const char* dtype_json_name(DType t);

// The fields shared by every family's checks: head_dim even for RoPE, top-k within the experts.
void check_common(const ConfigReader& r, const ModelConfig& c);

}  // namespace sluice
