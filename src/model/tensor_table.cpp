#include "model/tensor_table.h"

#include <fmt/format.h>

#include "kernels/cpu/transpose.h"
#include "model/family.h"

namespace sluice {

TensorTable tensor_table(const ModelConfig& c, ModelWeights& w) {
  w.layers.assign(size_t(c.num_layers), LayerWeights{});
  return family_spec(c.family).tensor_table(c, w);
}

Tensor mapped_slot(const ExpectedTensor& t, const Tensor& whole) {
  const size_t esize = dtype_size(whole.dtype);
  if (t.mapping == TensorMapping::kRows) {
    Tensor v = whole;
    v.data = static_cast<char*>(whole.data) + size_t(t.first_row) * size_t(whole.shape[1]) * esize;
    v.shape = {t.rows, whole.shape[1]};
    return v;
  }
  const int64_t E = t.experts, I = whole.shape[0] / E, H = whole.shape[1];
  if (t.mapping == TensorMapping::kExpertsFlat) {
    Tensor v = whole;
    v.shape = {E, I, H};
    return v;
  }
  // [E, I, H] → [E, H, I], expert by expert (any float dtype: bytes are moved, not converted).
  Tensor out = Tensor::allocate(whole.dtype, {E, H, I});
  const size_t expert_bytes = size_t(I * H) * esize;
  for (int64_t e = 0; e < E; ++e)
    cpu::transpose_matrix(static_cast<const char*>(whole.data) + size_t(e) * expert_bytes,
                     static_cast<char*>(out.data) + size_t(e) * expert_bytes, I, H, esize);
  return out;
}

void add_llama_embedding(const ModelConfig& c, ModelWeights& w, TensorTable& t) {
  t.add("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, &w.embed);
}

void add_llama_head(const ModelConfig& c, ModelWeights& w, TensorTable& t) {
  t.add("model.norm.weight", {c.hidden_size}, &w.final_norm);
  if (!c.tie_word_embeddings) t.add("lm_head.weight", {c.vocab_size, c.hidden_size}, &w.lm_head);
  t.ignored_suffixes.push_back("rotary_emb.inv_freq");
}

void add_llama_attention(const ModelConfig& c, const std::string& p, LayerWeights& L,
                         TensorTable& t) {
  const int64_t H = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
  t.add(p + "input_layernorm.weight", {H}, &L.attn_norm);
  t.add(p + "self_attn.q_proj.weight", {qd, H}, &L.wq);
  t.add(p + "self_attn.k_proj.weight", {kvd, H}, &L.wk);
  t.add(p + "self_attn.v_proj.weight", {kvd, H}, &L.wv);
  t.add(p + "self_attn.o_proj.weight", {H, qd}, &L.wo);
  if (c.qkv_bias) {
    t.add(p + "self_attn.q_proj.bias", {qd}, &L.bq);
    t.add(p + "self_attn.k_proj.bias", {kvd}, &L.bk);
    t.add(p + "self_attn.v_proj.bias", {kvd}, &L.bv);
  }
  if (c.o_bias) t.add(p + "self_attn.o_proj.bias", {H}, &L.bo);
  if (c.qk_norm != QkNorm::kNone) {
    const bool per_head = c.qk_norm == QkNorm::kPerHead;
    t.add(p + "self_attn.q_norm.weight", {per_head ? c.head_dim : qd}, &L.q_norm);
    t.add(p + "self_attn.k_norm.weight", {per_head ? c.head_dim : kvd}, &L.k_norm);
  }
  t.add(p + "post_attention_layernorm.weight", {H}, &L.ffn_norm);
}

void add_experts(const ModelConfig& c, const std::string& p, const ExpertNames& n, LayerWeights& L,
                 TensorTable& t) {
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size;
  t.add(fmt::format("{}{}.weight", p, n.router), {c.num_experts, H}, &L.router);
  for (int e = 0; e < c.num_experts; ++e) {
    const std::string ep = fmt::format("{}experts.{}.", p, e);
    t.add(ep + n.gate + ".weight", {I, H}, &L.expert_gate, e);  // silu(gate x)
    t.add(ep + n.up + ".weight", {I, H}, &L.expert_up, e);      // ... * up x
    t.add(ep + n.down + ".weight", {H, I}, &L.expert_down, e);  // down(...)
  }
}

void add_dense_mlp(const ModelConfig& c, const std::string& p, int I, LayerWeights& L,
                   TensorTable& t) {
  const int64_t H = c.hidden_size;
  t.add(p + "gate_proj.weight", {I, H}, &L.mlp_gate);
  t.add(p + "up_proj.weight", {I, H}, &L.mlp_up);
  t.add(p + "down_proj.weight", {H, I}, &L.mlp_down);
}

}  // namespace sluice
