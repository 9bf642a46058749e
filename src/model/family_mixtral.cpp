// Mixtral (MixtralForCausalLM): Llama-style attention with grouped KV heads, and a sparse MoE
// block whose router picks the top-k of E SwiGLU experts per token.
#include <fmt/format.h>

#include "model/tensor_table.h"

namespace sluice {

TensorTable mixtral_tensor_table(const ModelConfig& c, ModelWeights& w) {
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size, E = c.num_experts;
  TensorTable t;
  auto add = [&](std::string name, Shape shape, Tensor* slot, int expert = -1) {
    t.tensors.push_back({std::move(name), std::move(shape), slot, expert});
  };
  w.layers.resize(c.num_layers);
  add("model.embed_tokens.weight", {c.vocab_size, H}, &w.embed);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = w.layers[l];
    std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", {H}, &L.attn_norm);
    add(p + "self_attn.q_proj.weight", {c.q_dim(), H}, &L.wq);
    add(p + "self_attn.k_proj.weight", {c.kv_dim(), H}, &L.wk);
    add(p + "self_attn.v_proj.weight", {c.kv_dim(), H}, &L.wv);
    add(p + "self_attn.o_proj.weight", {H, c.q_dim()}, &L.wo);
    add(p + "post_attention_layernorm.weight", {H}, &L.ffn_norm);
    add(p + "block_sparse_moe.gate.weight", {E, H}, &L.router);
    for (int e = 0; e < E; ++e) {
      std::string ep = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
      add(ep + "w1.weight", {I, H}, &L.expert_gate, e);  // gate: silu(w1 x)
      add(ep + "w3.weight", {I, H}, &L.expert_up, e);    // up:   ... * w3 x
      add(ep + "w2.weight", {H, I}, &L.expert_down, e);  // down: w2(...)
    }
  }
  add("model.norm.weight", {H}, &w.final_norm);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, H}, &w.lm_head);
  t.ignored_suffixes = {"rotary_emb.inv_freq"};
  return t;
}

TensorTable tensor_table(const ModelConfig& c, ModelWeights& w) {
  switch (c.family) {
    case Family::Mixtral:
      return mixtral_tensor_table(c, w);
  }
  return {};
}

}  // namespace sluice
