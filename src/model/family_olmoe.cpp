// OLMoE (OlmoeForCausalLM; OLMoE-1B-7B): Llama-style attention whose q and k get an RMSNorm over
// the whole projection (OlmoeAttention: q_norm(q_proj(x)), q_norm of hidden_size and k_norm of
// kv_heads·head_dim), then, when clip_qkv is set, q, k and v clamped to ±clip_qkv, then RoPE.
// head_dim is always hidden_size / heads. 64 experts, top 8, softmax routing with no
// renormalisation unless norm_topk_prob; every layer MoE, no shared expert.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "model/family.h"

namespace sluice {

namespace {

void read_config(const ConfigReader& r, ModelConfig& c) {
  LlamaStyleDefaults d;  // OlmoeConfig's class defaults
  d.num_kv_heads = 0;    // None: one per query head
  d.rms_norm_eps = 1e-5f;
  d.rope_theta = 10000.f;
  d.max_position_embeddings = 4096;
  d.head_dim_field = false;
  read_llama_style(r, d, c);
  c.expert_intermediate_size = r.integer("intermediate_size");
  c.num_experts = r.integer("num_experts");
  c.experts_per_token = r.integer("num_experts_per_tok");
  c.normalize_topk = r.boolean_or("norm_topk_prob", false);
  c.qk_norm = QkNorm::kFullWidth;
  c.qkv_bias = c.o_bias = r.boolean_or("attention_bias", false);  // all four projections
  c.clip_qkv = r.number_or("clip_qkv", 0.f);                      // null: no clipping
  if (r.has("clip_qkv") && !(c.clip_qkv > 0))
    r.fail_field("clip_qkv", "expected a positive number or null, got {}", c.clip_qkv);
}

void write_config(const ModelConfig& c, nlohmann::json& j) {
  write_llama_style(c, j);
  j.erase("head_dim");  // not an OLMoE field: hidden_size / heads
  j["intermediate_size"] = c.expert_intermediate_size;
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.experts_per_token;
  j["norm_topk_prob"] = c.normalize_topk;
  j["attention_bias"] = c.qkv_bias;
  j["clip_qkv"] = c.clip_qkv > 0 ? nlohmann::json(c.clip_qkv) : nullptr;
  j["attention_dropout"] = 0.0;
  j["router_aux_loss_coef"] = 0.01;
  j["output_router_logits"] = false;
}

TensorTable table(const ModelConfig& c, ModelWeights& w) {
  TensorTable t;
  add_llama_embedding(c, w, t);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add_llama_attention(c, p, w.layers[size_t(l)], t);
    add_experts(c, p + "mlp.", {"gate", "gate_proj", "up_proj", "down_proj"}, w.layers[size_t(l)],
                t);
  }
  add_llama_head(c, w, t);
  return t;
}

// The Tulu template of OLMoE-1B-7B-Instruct (<|user|>, <|assistant|>, eos after each reply).
constexpr const char* kChatTemplate =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<|system|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'user' %}"
    "{{ '<|user|>\\n' + message['content'] + '\\n' }}{% else %}"
    "{{ '<|assistant|>\\n' + message['content'] + eos_token + '\\n' }}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}";

// llama.cpp's arch "olmoe": its graph does not renormalise the top-k weights; clip_qkv is
// attention.clamp_kqv; q/k rows as in the checkpoint.
const GgufNaming* gguf_naming() {
  static const GgufNaming naming{
      "olmoe",
      {{"intermediate_size", "expert_feed_forward_length", true, "feed_forward_length"},
       {"num_experts", "expert_count", true},
       {"num_experts_per_tok", "expert_used_count", true},
       {"norm_topk_prob", "expert_weights_norm"},
       {"clip_qkv", "attention.clamp_kqv"}},
      qwen_moe_gguf_tensor_names(),
      R"({"norm_topk_prob": false})",
      {{"attention_bias", "attn_q.bias"}}};
  return &naming;
}

}  // namespace

// GPT-NeoX-style byte-level BPE (GPT-2's pre-tokenizer), <|endoftext|> as bos and eos.
const FamilySpec& olmoe_family() {
  static const FamilySpec spec{
      Family::Olmoe,
      "olmoe",
      "OlmoeForCausalLM",
      read_config,
      write_config,
      table,
      TokenizerStyle{
          {"<|endoftext|>", "<|padding|>"}, 0, 0, -1, false, nullptr, false, kChatTemplate},
      gguf_naming()};
  return spec;
}

}  // namespace sluice
