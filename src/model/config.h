// One plain struct with every hyperparameter the runtime needs, read from a Hugging Face
// `config.json`. Family quirks are resolved here and in the family's tensor table, so the
// runtime never asks which family it runs.
#pragma once

#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sluice {

enum class Family { Mixtral };

std::string_view family_name(Family f);

struct ModelConfig {
  Family family = Family::Mixtral;
  std::string architecture;  // e.g. "MixtralForCausalLM"
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int expert_intermediate_size = 0;
  int num_experts = 0;
  int experts_per_token = 0;
  bool normalize_topk = true;  // Mixtral renormalises the top-k router weights to sum to one
  float rms_norm_eps = 1e-5f;
  float rope_theta = 1e6f;
  int max_position_embeddings = 0;
  int sliding_window = 0;  // 0: full causal attention
  bool tie_word_embeddings = false;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  DType dtype = DType::BF16;  // torch_dtype, the dtype presets write

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
};

// Parses a config.json document. `source` names the file in error messages.
ModelConfig parse_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_config(const std::filesystem::path& config_json);
nlohmann::json config_to_json(const ModelConfig& c);  // the config.json make-model writes

}  // namespace sluice
