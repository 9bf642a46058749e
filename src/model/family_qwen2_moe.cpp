// Qwen2-MoE (Qwen2MoeForCausalLM; Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Llama-style attention with
// q, k and v biases (qkv_bias, default true; o_proj has none) and no q/k norms. The sparse
// block adds to the routed experts (softmax, then top-k renormalised only when norm_topk_prob)
// a shared expert of shared_expert_intermediate_size over every token, scaled by
// sigmoid(shared_expert_gate · x) (Qwen2MoeSparseMoeBlock). Layers in mlp_only_layers, or off
// the decoder_sparse_step rhythm, have a dense MLP of intermediate_size instead.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "io/json_number.h"
#include "model/family.h"

namespace sluice {

namespace {

// Qwen2MoeConfig puts a sliding window on some layers only (layer_types); one window for the
// whole model is all the engine's attention takes, so such configs are refused.
void refuse_per_layer_windows(const ConfigReader& r) {
  if (r.boolean_or("use_sliding_window", false))
    r.fail_field("use_sliding_window",
                 "Qwen2-MoE slides the window over some layers only (layer_types, "
                 "max_window_layers), which is not supported; expected false");
  if (!r.has("layer_types")) return;
  const nlohmann::json& types = r.doc()["layer_types"];
  if (!types.is_array()) r.wrong_type("layer_types", "a list of layer types");
  for (const auto& t : types)
    if (!t.is_string() || t.get_ref<const std::string&>() != "full_attention")
      r.fail_field("layer_types", "only \"full_attention\" layers are supported, got {}",
                   json_excerpt(t));
}

void read_config(const ConfigReader& r, ModelConfig& c) {
  LlamaStyleDefaults d;  // Qwen2MoeConfig's class defaults
  d.num_kv_heads = 16;
  d.rms_norm_eps = 1e-6f;
  d.rope_theta = 10000.f;
  d.max_position_embeddings = 32768;
  read_llama_style(r, d, c);
  c.expert_intermediate_size = r.integer("moe_intermediate_size");
  c.num_experts = r.integer("num_experts");
  c.experts_per_token = r.integer("num_experts_per_tok");
  c.normalize_topk = r.boolean_or("norm_topk_prob", false);
  c.shared_expert_intermediate_size = r.integer("shared_expert_intermediate_size");
  c.shared_expert_gate = true;
  c.qkv_bias = r.boolean_or("qkv_bias", true);
  c.dense_intermediate_size = r.integer_or("intermediate_size", 5632);
  read_qwen_dense_layers(r, c);
  refuse_per_layer_windows(r);
}

void write_config(const ModelConfig& c, nlohmann::json& j) {
  write_llama_style(c, j);
  j["moe_intermediate_size"] = c.expert_intermediate_size;
  j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  j["intermediate_size"] = c.dense_intermediate_size;
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.experts_per_token;
  j["norm_topk_prob"] = c.normalize_topk;
  j["qkv_bias"] = c.qkv_bias;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = c.dense_layers;
  j["use_sliding_window"] = false;
  j["max_window_layers"] = c.num_layers;
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
    if (!c.is_moe_layer(l)) {
      add_dense_mlp(c, p + "mlp.", c.dense_intermediate_size, L, t);
      continue;
    }
    add_experts(c, p + "mlp.", {"gate", "gate_proj", "up_proj", "down_proj"}, L, t);
    // F.sigmoid(shared_expert_gate(x)) * shared_expert(x)
    add_dense_mlp(c, p + "mlp.shared_expert.", c.shared_expert_intermediate_size, L, t);
    t.add(p + "mlp.shared_expert_gate.weight", {1, c.hidden_size}, &L.mlp_scale);
  }
  add_llama_head(c, w, t);
  return t;
}

// llama.cpp's arch "qwen2moe": its graph does not renormalise the top-k weights (Qwen2-MoE's
// published norm_topk_prob is false); q/k rows as in the checkpoint.
const GgufNaming* gguf_naming() {
  static const GgufNaming naming{
      "qwen2moe",
      {{"moe_intermediate_size", "expert_feed_forward_length", true},
       {"shared_expert_intermediate_size", "expert_shared_feed_forward_length", true,
        "feed_forward_length"},
       {"intermediate_size", "feed_forward_length"},
       {"num_experts", "expert_count", true},
       {"num_experts_per_tok", "expert_used_count", true},
       {"norm_topk_prob", "expert_weights_norm"}},
      qwen_moe_gguf_tensor_names(),
      R"({"norm_topk_prob": false})",
      {{"qkv_bias", "attn_q.bias"}},
      "mlp_only_layers"};
  return &naming;
}

}  // namespace

const FamilySpec& qwen2_moe_family() {
  static const FamilySpec spec{
      Family::Qwen2Moe, "qwen2_moe", "Qwen2MoeForCausalLM",  read_config,
      write_config,     table,       qwen_tokenizer_style(), gguf_naming()};
  return spec;
}

}  // namespace sluice
