// Qwen3-MoE (Qwen3MoeForCausalLM; Qwen3-30B-A3B, Qwen3-235B-A22B): Llama-style attention whose q
// and k get an RMSNorm over each head's head_dim values after their projections, before RoPE
// (Qwen3MoeAttention: q_norm(q_proj(x).view(..., head_dim))); head_dim is its own field, not
// hidden_size / heads. Softmax routing then top-k, renormalised only when norm_topk_prob; no
// shared expert. Layers in mlp_only_layers, or off the decoder_sparse_step rhythm, have a dense
// MLP of intermediate_size instead of the MoE block (none in the published models).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "model/family.h"

namespace sluice {

namespace {

void read_config(const ConfigReader& r, ModelConfig& c) {
  LlamaStyleDefaults d;  // Qwen3MoeConfig's class defaults
  d.num_kv_heads = 4;
  d.rms_norm_eps = 1e-6f;
  d.rope_theta = 10000.f;
  d.max_position_embeddings = 32768;
  read_llama_style(r, d, c);
  c.expert_intermediate_size = r.integer("moe_intermediate_size");
  c.num_experts = r.integer("num_experts");
  c.experts_per_token = r.integer("num_experts_per_tok");
  c.normalize_topk = r.boolean_or("norm_topk_prob", false);
  c.qk_norm = QkNorm::kPerHead;
  c.qkv_bias = c.o_bias = r.boolean_or("attention_bias", false);  // all four projections
  c.dense_intermediate_size = r.integer_or("intermediate_size", 6144);
  read_qwen_dense_layers(r, c);
  // Every layer's attention takes the window when use_sliding_window (Qwen3MoeAttention reads
  // config.sliding_window, which the config nulls otherwise); max_window_layers plays no part.
  c.sliding_window =
      r.boolean_or("use_sliding_window", false) ? r.integer_or("sliding_window", 4096) : 0;
}

void write_config(const ModelConfig& c, nlohmann::json& j) {
  write_llama_style(c, j);
  j["moe_intermediate_size"] = c.expert_intermediate_size;
  j["intermediate_size"] = c.dense_intermediate_size;
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.experts_per_token;
  j["norm_topk_prob"] = c.normalize_topk;
  j["attention_bias"] = c.qkv_bias;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = c.dense_layers;
  j["use_sliding_window"] = c.sliding_window > 0;
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  j["attention_dropout"] = 0.0;
  j["router_aux_loss_coef"] = 0.001;
  j["output_router_logits"] = false;
}

TensorTable table(const ModelConfig& c, ModelWeights& w) {
  TensorTable t;
  add_llama_embedding(c, w, t);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights& L = w.layers[size_t(l)];
    add_llama_attention(c, p, L, t);
    if (c.is_moe_layer(l))
      add_experts(c, p + "mlp.", {"gate", "gate_proj", "up_proj", "down_proj"}, L, t);
    else
      add_dense_mlp(c, p + "mlp.", c.dense_intermediate_size, L, t);
  }
  add_llama_head(c, w, t);
  return t;
}

// llama.cpp's arch "qwen3moe": its graph renormalises the top-k weights (Qwen3's published
// norm_topk_prob); q/k rows as in the checkpoint.
const GgufNaming* gguf_naming() {
  static const GgufNaming naming{"qwen3moe",
                                 {{"moe_intermediate_size", "expert_feed_forward_length", true},
                                  {"intermediate_size", "feed_forward_length"},
                                  {"num_experts", "expert_count", true},
                                  {"num_experts_per_tok", "expert_used_count", true},
                                  {"norm_topk_prob", "expert_weights_norm"}},
                                 qwen_moe_gguf_tensor_names(),
                                 R"({"norm_topk_prob": true})",
                                 {{"attention_bias", "attn_q.bias"}},
                                 "mlp_only_layers"};
  return &naming;
}

}  // namespace

// The Qwen MoE block's names (Qwen2-MoE's shared expert included), which OLMoE shares in part.
const std::vector<GgufTensorName>& qwen_moe_gguf_tensor_names() {
  static const std::vector<GgufTensorName> names = {
      {"mlp.gate", "ffn_gate_inp"},
      {"mlp.experts.*.gate_proj", "ffn_gate_exps"},
      {"mlp.experts.*.up_proj", "ffn_up_exps"},
      {"mlp.experts.*.down_proj", "ffn_down_exps"},
      {"mlp.shared_expert.gate_proj", "ffn_gate_shexp"},
      {"mlp.shared_expert.up_proj", "ffn_up_shexp"},
      {"mlp.shared_expert.down_proj", "ffn_down_shexp"},
      {"mlp.shared_expert_gate", "ffn_gate_inp_shexp"},
      {"mlp.gate_proj", "ffn_gate"},  // a dense layer's MLP
      {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  return names;
}

// ChatML, as Qwen's chat templates write it (without their tool-calling and thinking parts).
const TokenizerStyle& qwen_tokenizer_style() {
  static const TokenizerStyle style{
      {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
      0,
      2,
      -1,
      false,
      "qwen2",
      true,
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}"};
  return style;
}

const FamilySpec& qwen3_moe_family() {
  static const FamilySpec spec{
      Family::Qwen3Moe, "qwen3_moe", "Qwen3MoeForCausalLM",  read_config,
      write_config,     table,       qwen_tokenizer_style(), gguf_naming()};
  return spec;
}

}  // namespace sluice
