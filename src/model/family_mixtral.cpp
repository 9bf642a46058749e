// Mixtral (MixtralForCausalLM): Llama-style attention with grouped KV heads, and a sparse MoE
// block whose router picks the top-k of E SwiGLU experts per token and renormalises their
// weights. No biases, no q/k norms, every layer MoE.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "model/family.h"

namespace sluice {

namespace {

void read_config(const ConfigReader& r, ModelConfig& c) {
  LlamaStyleDefaults d;  // MixtralConfig's class defaults
  d.num_kv_heads = 8;
  d.rms_norm_eps = 1e-5f;
  d.rope_theta = 1e6f;
  d.max_position_embeddings = 4096 * 32;
  read_llama_style(r, d, c);
  c.expert_intermediate_size = r.integer("intermediate_size");
  c.num_experts = r.integer("num_local_experts");
  c.experts_per_token = r.integer("num_experts_per_tok");
  c.normalize_topk = true;
  c.sliding_window = r.integer_or("sliding_window", 0);
}

void write_config(const ModelConfig& c, nlohmann::json& j) {
  write_llama_style(c, j);
  j["intermediate_size"] = c.expert_intermediate_size;
  j["num_local_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.experts_per_token;
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  j["router_aux_loss_coef"] = 0.02;
  j["output_router_logits"] = false;
}

TensorTable table(const ModelConfig& c, ModelWeights& w) {
  TensorTable t;
  add_llama_embedding(c, w, t);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add_llama_attention(c, p, w.layers[size_t(l)], t);
    // w2(silu(w1 x) * w3 x)
    add_experts(c, p + "block_sparse_moe.", {"gate", "w1", "w3", "w2"}, w.layers[size_t(l)], t);
  }
  add_llama_head(c, w, t);
  return t;
}

// Mistral's [INST] template over byte-level BPE (the published Mixtral tokenizer is
// SentencePiece; its pieces do not matter to random weights, its template does).
constexpr const char* kChatTemplate =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ message['content'] + '\\n\\n' }}{% elif message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}";

// llama.cpp stores Mixtral as arch "llama" with experts (its LlamaModel converter), q/k rows
// interleaved for its RoPE, and always renormalises the top-k weights.
const GgufNaming* gguf_naming() {
  static const GgufNaming naming{
      "llama",
      {{"intermediate_size", "feed_forward_length", true, "expert_feed_forward_length"},
       {"num_local_experts", "expert_count", true},
       {"num_experts_per_tok", "expert_used_count", true},
       {"sliding_window", "attention.sliding_window"}},
      {{"block_sparse_moe.gate", "ffn_gate_inp"},
       {"block_sparse_moe.experts.*.w1", "ffn_gate_exps"},
       {"block_sparse_moe.experts.*.w3", "ffn_up_exps"},
       {"block_sparse_moe.experts.*.w2", "ffn_down_exps"}},
      "{}",
      {},
      nullptr,
      true};
  return &naming;
}

}  // namespace

const FamilySpec& mixtral_family() {
  static const FamilySpec spec{
      Family::Mixtral,
      "mixtral",
      "MixtralForCausalLM",
      read_config,
      write_config,
      table,
      TokenizerStyle{{"<unk>", "<s>", "</s>"}, 1, 2, 0, true, nullptr, false, kChatTemplate},
      gguf_naming()};
  return spec;
}

}  // namespace sluice
