// One plain struct with every hyperparameter the runtime needs, read from a Hugging Face
// `config.json`. A family is a description: its file in src/model/ (family_*.cpp, listed in
// family.h) reads its config.json into these fields and maps its tensor names onto the canonical
// weights (weights.h); the runtime reads the fields and the presence of the optional weights, and
// never asks which family it runs.
#pragma once

#include <array>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sluice {

enum class Family { Mixtral, Qwen3Moe, Olmoe, Qwen2Moe, Dbrx, DeepseekV2, DeepseekV3 };

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
  kSigmoid,  // sigmoid of each logit, then the top-k (renormalised iff normalize_topk)
};

// How a group of experts is scored when the router picks groups first (expert_groups > 1).
enum class GroupScore {
  kMax,        // its best expert's score (DeepSeek-V2's group_limited_greedy)
  kTopTwoSum,  // the sum of its two best (DeepSeek-V3's noaux_tc, bias included)
};

// The attention block's shape.
enum class AttentionKind {
  kMultiHead,  // q, k, v projections of heads (and kv_heads) × head_dim
  // Multi-head latent attention (DeepSeek-V2/V3): k and v come from one compressed latent of
  // kv_lora_rank values per token (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj) plus one
  // RoPE key of qk_rope_head_dim values shared by all heads; q optionally through a low-rank
  // q_lora_rank bottleneck (q_a_proj, q_a_layernorm, q_b_proj). Each q/k head is
  // qk_nope_head_dim values without RoPE followed by qk_rope_head_dim with it; v heads are
  // v_head_dim. head_dim is qk_nope_head_dim + qk_rope_head_dim.
  kLatent,
};

struct LatentAttentionShape {
  int q_lora_rank = 0;  // 0: q straight from q_proj
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
};

// RoPE frequency scaling (rope_scaling / rope_parameters).
enum class RopeScalingKind {
  kNone,
  // YaRN (transformers' _compute_yarn_parameters): frequencies blended between the original and
  // the factor-interpolated ones by a ramp over [beta_fast, beta_slow] rotations, cos and sin
  // multiplied by the attention factor.
  kYarn,
};

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::kNone;
  float factor = 1.f;
  int original_max_position_embeddings = 0;  // 0: max_position_embeddings
  float beta_fast = 32.f, beta_slow = 1.f;
  float mscale = 0.f, mscale_all_dim = 0.f;  // 0: absent
  float attention_factor = 0.f;              // 0: absent (derived from mscale, mscale_all_dim)
  bool truncate = true;
};

// How the routed and shared experts' weights are held in memory (attention, router, norms,
// embeddings and lm_head stay as the checkpoint stores them). int8 and int4 are symmetric with one
// fp32 scale per row and group of `group_size` consecutive inputs (kernels/cpu/gemm_int8.h); a
// quantized expert slot of LayerWeights is then a U8 tensor of packed matrices
// (model/expert_quant.h). A quantized checkpoint's config.json says so in its "quantization"
// field; --expert-dtype asks for it at load.
enum class ExpertDtype : uint8_t { kBf16, kInt8, kInt4 };
struct ExpertQuant {
  ExpertDtype dtype = ExpertDtype::kBf16;
  int group_size = 0;  // 0 with bf16; at load 0 means the default (expert_quant.h)
  bool quantized() const { return dtype != ExpertDtype::kBf16; }
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
  RopeScaling rope_scaling;
  // RoPE rotates pairs (x[2i], x[2i+1]) by frequency i (DeepSeek's complex form, equally
  // transformers' rope_interleave) instead of (x[i], x[i + d/2]) (rotate_half).
  bool rope_interleaved = false;

  // Attention quirks.
  NormKind norm = NormKind::kRms;
  bool qkv_bias = false;  // q, k and v projections have biases (LayerWeights::bq, bk, bv)
  bool o_bias = false;    // the output projection has one (LayerWeights::bo)
  QkNorm qk_norm = QkNorm::kNone;
  float clip_qkv = 0;  // > 0: q, k, v clamped to [-clip_qkv, clip_qkv] after their norms
  AttentionKind attention = AttentionKind::kMultiHead;
  LatentAttentionShape mla;  // kLatent only

  // The sparse MoE block of MoE layers.
  int expert_intermediate_size = 0;
  int num_experts = 0;
  int experts_per_token = 0;
  RouterScore router_score = RouterScore::kSoftmax;
  bool normalize_topk = true;  // the top-k weights renormalised to sum to one
  // Group-limited selection: the experts split into expert_groups equal groups, each scored by
  // group_score; only the experts of the best groups_per_token groups compete for the top-k.
  int expert_groups = 1;
  int groups_per_token = 1;
  GroupScore group_score = GroupScore::kMax;
  // A per-expert bias (LayerWeights::router_bias) added to the scores for choosing the experts
  // only; the weights are the unbiased scores (DeepSeek-V3's e_score_correction_bias).
  bool router_selection_bias = false;
  float routed_scaling_factor = 1.f;  // the routed experts' weights multiplied by this

  // The dense MLP every token goes through: in a MoE layer the shared expert (when
  // shared_expert_intermediate_size > 0), added to the routed experts' output and scaled by
  // sigmoid(shared_expert_gate · x) when shared_expert_gate; in a dense layer (`dense_layers`),
  // the layer's whole FFN, of dense_intermediate_size.
  int shared_expert_intermediate_size = 0;
  bool shared_expert_gate = false;
  int dense_intermediate_size = 0;
  std::vector<int> dense_layers;  // layer indices without a MoE block, ascending
  // Multi-token-prediction layers stored after the decoder layers (DeepSeek-V3's
  // num_nextn_predict_layers): not run; their tensors are skipped.
  int mtp_layers = 0;

  ExpertQuant expert_quant;  // the experts' weights in memory: bf16, or quantized
  // How the checkpoint stores the routed experts' gate, up and down (what the disk tier reads)
  // where that is not what the kernels take: DBRX's down transposed ([I, H], its w2, used as
  // act @ w2), or a GGUF file's block types. The disk tier makes bf16 [n, k] of such a matrix as
  // each expert lands, in a second buffer of its pool slot.
  struct StoredExpertMatrix {
    bool made_on_read = false;
    double file_bytes_per_value = 0;  // 0: as expert_quant and fp8_weights say (else bf16's 2);
                                      // a GGUF file's the largest over its layers
  };
  std::array<StoredExpertMatrix, 3> stored_experts{};
  // config.json's quantization_config says the checkpoint holds FP8 e4m3 weights with 128 × 128
  // block scales (model/fp8_weights.h); which tensors are FP8 their dtypes say.
  bool fp8_weights = false;

  int q_dim() const { return num_heads * head_dim; }
  // The width of the attention output entering o_proj: heads × v_head_dim with MLA.
  int attn_out_dim() const {
    return attention == AttentionKind::kLatent ? num_heads * mla.v_head_dim : q_dim();
  }
  // Values the KV cache keeps per token and layer: K and V of every KV head, or with MLA the
  // latent and the shared RoPE key.
  int kv_cache_values_per_token() const {
    return attention == AttentionKind::kLatent ? mla.kv_lora_rank + mla.qk_rope_head_dim
                                               : 2 * kv_dim();
  }
  // FLOPs of attention per (query row, key position): QK and PV over every head, 4 · q_dim; with
  // MLA in the absorbed form, per head a dot product with the latent and the RoPE key and an
  // axpy of the latent, 2 · heads · (2 · kv_lora_rank + qk_rope_head_dim).
  double attention_flops_per_pair() const {
    return attention == AttentionKind::kLatent
               ? 2.0 * num_heads * (2.0 * mla.kv_lora_rank + mla.qk_rope_head_dim)
               : 4.0 * q_dim();
  }
  // Elements of one layer's attention projections (without norms and biases).
  int64_t attention_weight_elements() const;
  // softmax(q·kᵀ × attention_scale()): 1/sqrt(head_dim), with YaRN's mscale_all_dim
  // correction (yarn_get_mscale(factor, mscale_all_dim)²) when the config gives one.
  float attention_scale() const;
  // The multiplier of RoPE's cos and sin (YaRN's attention factor; 1 without scaling).
  float rope_attention_factor() const;
  // The number of values RoPE rotates in each q/k head: all of head_dim, or MLA's rope part.
  int rope_dim() const {
    return attention == AttentionKind::kLatent ? mla.qk_rope_head_dim : head_dim;
  }
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

// RoPE's inverse frequencies over the rope_dim() rotated values: theta^(-2i/d), or YaRN's blend
// (transformers' _compute_yarn_parameters) when rope_scaling says so.
std::vector<float> rope_inv_freq(const ModelConfig& c);

// Parses a config.json document. `source` names the file in error messages.
ModelConfig parse_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_config(const std::filesystem::path& config_json);
nlohmann::json config_to_json(const ModelConfig& c);  // the config.json make-model writes

}  // namespace sluice
