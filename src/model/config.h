// One plain struct with every hyperparameter the runtime needs, read from a Hugging Face
// `config.json`. A family is a description: its file in src/model/ (family_*.cpp, listed in
// family.h) reads its config.json into these fields and maps its tensor names onto the canonical
// weights (weights.h); the runtime reads the fields and the presence of the optional weights, and
// never asks which family it runs.
#pragma once

#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sluice {

enum class Family { Mixtral, Qwen3Moe, Olmoe, Qwen2Moe, Dbrx };

std::string_view family_name(Family f);

// The norm before attention, before the FFN and before the lm_head.
enum class NormKind {
  kRms,        // w ⊙ x / sqrt(mean(x²) + eps)
  kLayerNorm,  // w ⊙ (x - mean) / sqrt(var + eps), no bias
};

// The RMSNorm on q and k, after their projections (and biases), before clipping and RoPE; its
// eps is rms_norm_eps. Its weights are LayerWeights::q_norm / k_norm.
enum class QkNorm {
  kNone,
  kPerHead,    // over each head's head_dim values, one [head_dim] weight shared by all heads
  kFullWidth,  // over the whole projection, [q_dim] and [kv_dim] weights
};

// How router logits become expert weights.
enum class RouterScore {
  kSoftmax,  // softmax over all experts, then the top-k (renormalised iff normalize_topk)
};

struct ModelConfig {
  Family family = Family::Mixtral;
  std::string architecture;  // e.g. "MixtralForCausalLM"
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-5f;  // the eps of every norm, whatever its kind
  float rope_theta = 1e6f;
  int max_position_embeddings = 0;
  int sliding_window = 0;  // 0: full causal attention
  bool tie_word_embeddings = false;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  DType dtype = DType::BF16;  // torch_dtype, the dtype presets write

  // Attention quirks.
  NormKind norm = NormKind::kRms;
  bool qkv_bias = false;  // q, k and v projections have biases (LayerWeights::bq, bk, bv)
  bool o_bias = false;    // the output projection has one (LayerWeights::bo)
  QkNorm qk_norm = QkNorm::kNone;
  float clip_qkv = 0;  // > 0: q, k, v clamped to [-clip_qkv, clip_qkv] after their norms

  // The sparse MoE block of MoE layers.
  int expert_intermediate_size = 0;
  int num_experts = 0;
  int experts_per_token = 0;
  RouterScore router_score = RouterScore::kSoftmax;
  bool normalize_topk = true;  // the top-k weights renormalised to sum to one

  // The dense MLP every token goes through: in a MoE layer the shared expert (when
  // shared_expert_intermediate_size > 0), added to the routed experts' output and scaled by
  // sigmoid(shared_expert_gate · x) when shared_expert_gate; in a dense layer (`dense_layers`),
  // the layer's whole FFN, of dense_intermediate_size.
  int shared_expert_intermediate_size = 0;
  bool shared_expert_gate = false;
  int dense_intermediate_size = 0;
  std::vector<int> dense_layers;  // layer indices without a MoE block, ascending

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // Elements of a layer's q_norm and k_norm weights (0 without q/k norms).
  int q_norm_size() const {
    return qk_norm == QkNorm::kNone ? 0 : qk_norm == QkNorm::kPerHead ? head_dim : q_dim();
  }
  int k_norm_size() const {
    return qk_norm == QkNorm::kNone ? 0 : qk_norm == QkNorm::kPerHead ? head_dim : kv_dim();
  }
  bool is_moe_layer(int layer) const;
  // The intermediate size of layer `layer`'s dense MLP (LayerWeights::mlp_*); 0: none.
  int dense_mlp_size(int layer) const;
};

// Parses a config.json document. `source` names the file in error messages.
ModelConfig parse_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_config(const std::filesystem::path& config_json);
nlohmann::json config_to_json(const ModelConfig& c);  // the config.json make-model writes

}  // namespace sluice
