#include "engine/offload_layout.h"

#include <algorithm>

#include "core/error.h"
#include "engine/offload_executor.h"
#include "model/expert_quant.h"
#include "model/fp8_weights.h"

namespace sluice {

int widest_dense_mlp(const ModelConfig& c) {
  int widest = 0;
  for (int l = 0; l < c.num_layers; ++l) widest = std::max(widest, c.dense_mlp_size(l));
  return widest;
}

size_t resident_layout(const ModelConfig& c, std::vector<LayerResident>* layers, size_t* inv_freq) {
  ArenaLayout L;
  const bool latent = c.attention == AttentionKind::kLatent;
  const size_t H = size_t(c.hidden_size), qd = size_t(c.q_dim());
  const size_t kvd = latent ? 0 : size_t(c.kv_dim()), ad = size_t(c.attn_out_dim());
  const size_t qa = latent ? size_t(c.mla.q_lora_rank) : 0;
  const size_t ckv = latent ? size_t(c.kv_cache_values_per_token()) : 0;
  for (int l = 0; l < c.num_layers; ++l) {
    LayerResident r;
    r.moe = c.is_moe_layer(l);
    r.qkv_bias = c.qkv_bias;
    r.o_bias = c.o_bias;
    r.mlp_I = c.dense_mlp_size(l);
    r.mlp_scaled = r.moe && r.mlp_I > 0 && c.shared_expert_gate;
    const size_t I = size_t(r.mlp_I);
    r.attn_norm = L.add(H * 4);
    r.ffn_norm = L.add(H * 4);
    // An absent projection (n = 0) takes no bytes in either form.
    auto projection = [&](size_t n, size_t k) {
      return L.add(projection_bytes(c, int64_t(n), int64_t(k)));
    };
    r.wq = projection(qa > 0 ? 0 : qd, H);
    r.wk = projection(kvd, H);
    r.wv = projection(kvd, H);
    r.wo = projection(H, ad);
    r.q_a = projection(qa, H);
    r.q_a_norm = L.add(qa * 4);
    r.q_b = projection(qd, qa);
    r.kv_a = projection(ckv, H);
    r.router_bias = L.add(r.moe && c.router_selection_bias ? size_t(c.num_experts) * 4 : 0);
    r.router = L.add(r.moe ? size_t(c.num_experts) * H * 2 : 0);
    r.q_norm = L.add(size_t(c.q_norm_size()) * 4);
    r.k_norm = L.add(size_t(c.k_norm_size()) * 4);
    r.bq = L.add(r.qkv_bias ? qd * 4 : 0);
    r.bk = L.add(r.qkv_bias ? kvd * 4 : 0);
    r.bv = L.add(r.qkv_bias ? kvd * 4 : 0);
    r.bo = L.add(r.o_bias ? H * 4 : 0);
    r.mlp_gate = L.add(I ? expert_matrix_bytes(c, int64_t(I), int64_t(H)) : 0);
    r.mlp_up = L.add(I ? expert_matrix_bytes(c, int64_t(I), int64_t(H)) : 0);
    r.mlp_down = L.add(I ? expert_matrix_bytes(c, int64_t(H), int64_t(I)) : 0);
    r.mlp_scale = L.add(r.mlp_scaled ? H * 2 : 0);
    if (layers) layers->push_back(r);
  }
  const size_t f = L.add(size_t(c.head_dim / 2) * 4);
  if (inv_freq) *inv_freq = f;
  return L.size();
}

cpu::Fp8Matrix fp8_device_matrix(const void* base, int64_t n, int64_t k) {
  const auto* scales = static_cast<const float*>(base);
  const size_t scale_count = size_t(shape_numel(fp8_scale_shape(n, k)));
  return {
      .q = reinterpret_cast<const uint8_t*>(scales + scale_count), .scale = scales, .n = n, .k = k};
}

size_t expert_matrix_bytes(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size;
  // Packed quantized matrices pad rows to 16, so w1/w3 [I, H] and w2 [H, I] may differ a little.
  return std::max(expert_matrix_bytes(c, I, H), expert_matrix_bytes(c, H, I));
}

size_t resident_experts_bytes(const ModelConfig& c, int resident_layers) {
  return size_t(resident_layers) * 3 * size_t(c.num_experts) * expert_matrix_bytes(c);
}

size_t resident_expert_offset(const ModelConfig& c, int j, int m, int e) {
  return ((size_t(j) * 3 + size_t(m)) * size_t(c.num_experts) + size_t(e)) * expert_matrix_bytes(c);
}

double cpu_attention_share(const OffloadSettings& s) {
  if (s.cpu_attention_share == -1) return 1.0;
  if (!(s.cpu_attention_share >= 0 && s.cpu_attention_share <= 1))
    fail(
        "offload executor: field 'cpu_attention_share': expected 0 to 1 (the CPU's share of the "
        "sequences' attention), or -1 for not set, got {}",
        s.cpu_attention_share);
  return s.cpu_attention_share;
}

int resident_expert_layers(const ModelConfig& c, const OffloadSettings& s) {
  if (s.resident_expert_layers < -1 || s.resident_expert_layers > c.num_layers)
    fail(
        "offload executor: field 'resident_expert_layers': expected 0 to {} (the model's layers), "
        "or -1 for not set, got {}",
        c.num_layers, s.resident_expert_layers);
  return std::max(0, s.resident_expert_layers);
}

OffloadFootprint offload_footprint(const ModelConfig& c, const Policy& p,
                                   const OffloadSettings& s) {
  if (p.batch <= 0 || p.prefill_chunk <= 0 || p.expert_batch <= 0 || p.attn_micro_batch <= 0)
    fail(
        "offload executor: fields 'batch', 'prefill_chunk', 'expert_batch', 'attn_micro_batch': "
        "expected a resolved policy (all > 0), got {}",
        p.describe());
  OffloadFootprint f;
  f.resident = resident_layout(c, nullptr, nullptr);
  f.resident_layers = resident_expert_layers(c, s);
  f.resident_experts = resident_experts_bytes(c, f.resident_layers);
  if (s.lm_head != LmHeadPlace::kHost) f.lm_head = LmHeadLayout(c).bytes;
  const BufferShape shape(c, p, s);
  f.buffers = BufferLayout(shape).bytes;
  f.kv_pool = DeviceKvLayout(c, p, shape.gpu_kv_blocks).bytes;
  const size_t matrix = expert_matrix_bytes(c);
  if (s.page_bytes != 0 && s.page_bytes < matrix)
    fail(
        "offload executor: field 'page_bytes': expected at least one expert matrix ({} bytes, "
        "{}x{} {}; matrices are not split across pages), got {}",
        matrix, c.expert_intermediate_size, c.hidden_size,
        expert_dtype_name(c.expert_quant.dtype), s.page_bytes);
  f.page_bytes = s.page_bytes ? s.page_bytes : matrix;
  if (f.resident_layers == c.num_layers) f.min_slots = 0;  // no expert streams
  return f;
}

}  // namespace sluice
