#include "engine/offload_layout.h"

#include "core/error.h"
#include "engine/offload_executor.h"

namespace sluice {

size_t resident_layout(const ModelConfig& c, std::vector<LayerResident>* layers, size_t* inv_freq) {
  ArenaLayout L;
  const size_t H = size_t(c.hidden_size), qd = size_t(c.q_dim()), kvd = size_t(c.kv_dim());
  for (int l = 0; l < c.num_layers; ++l) {
    LayerResident r;
    r.attn_norm = L.add(H * 4);
    r.ffn_norm = L.add(H * 4);
    r.wq = L.add(qd * H * 2);
    r.wk = L.add(kvd * H * 2);
    r.wv = L.add(kvd * H * 2);
    r.wo = L.add(H * qd * 2);
    r.router = L.add(size_t(c.num_experts) * H * 2);
    r.q_norm = L.add(size_t(c.q_norm_size()) * 4);
    r.k_norm = L.add(size_t(c.k_norm_size()) * 4);
    if (layers) layers->push_back(r);
  }
  const size_t f = L.add(size_t(c.head_dim / 2) * 4);
  if (inv_freq) *inv_freq = f;
  return L.size();
}

void check_offload_supports(const ModelConfig& c) {
  auto refuse = [&](const char* feature, const char* field) {
    fail(
        "offload executor: {} uses {} (config field '{}'), which the offload path does not run "
        "yet; run it with --device cpu",
        c.architecture, feature, field);
  };
  if (c.qkv_bias || c.o_bias) refuse("attention projection biases", "qkv_bias/attention_bias");
  if (c.clip_qkv > 0) refuse("q/k/v clipping", "clip_qkv");
  if (c.norm != NormKind::kRms) refuse("LayerNorm", "norm");
  if (c.attention == AttentionKind::kLatent)
    refuse("multi-head latent attention (MLA)", "kv_lora_rank");
  if (c.shared_expert_intermediate_size > 0)
    refuse("a shared expert", "shared_expert_intermediate_size");
  for (int l = 0; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l)) refuse("dense MLP layers", "mlp_only_layers/decoder_sparse_step");
}

size_t expert_matrix_bytes(const ModelConfig& c) {
  return size_t(c.expert_intermediate_size) * size_t(c.hidden_size) * 2;
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
  check_offload_supports(c);
  OffloadFootprint f;
  f.resident = resident_layout(c, nullptr, nullptr);
  f.resident_layers = resident_expert_layers(c, s);
  f.resident_experts = resident_experts_bytes(c, f.resident_layers);
  if (s.lm_head != LmHeadPlace::kHost) f.lm_head = LmHeadLayout(c).bytes;
  const StepShape shape(c, p, s);
  f.buffers = BufferLayout(shape).bytes;
  f.kv_pool = DeviceKvLayout(c, p, shape.gpu_kv_blocks).bytes;
  const size_t matrix = expert_matrix_bytes(c);
  if (s.page_bytes != 0 && s.page_bytes < matrix)
    fail(
        "offload executor: field 'page_bytes': expected at least one expert matrix ({} bytes, "
        "{}x{} bf16; matrices are not split across pages), got {}",
        matrix, c.expert_intermediate_size, c.hidden_size, s.page_bytes);
  f.page_bytes = s.page_bytes ? s.page_bytes : matrix;
  if (f.resident_layers == c.num_layers) f.min_slots = 0;  // no expert streams
  return f;
}

}  // namespace sluice
