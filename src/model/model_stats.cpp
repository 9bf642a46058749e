#include "model/model_stats.h"

#include <set>

#include "model/expert_quant.h"

namespace sluice {

namespace {

// The parameters of `t`: its values; for int8/int4 experts and MLPs packed at load (U8 bytes
// with their group scales, model/expert_quant.h), those of the n × k matrices it packs, one per
// leading index when stacked.
int64_t params_of(const Tensor& t, int64_t n, int64_t k) {
  if (t.dtype != DType::U8 || n == 0) return t.numel();
  return (t.shape.size() > 1 ? t.shape[0] : 1) * n * k;
}

}  // namespace

ModelStats model_stats(const Model& m) {
  ModelStats s;
  const ModelConfig& c = m.config;
  const ModelWeights& w = m.weights;
  std::set<const void*> seen;  // tied embeddings count once
  // `n` × `k`: the shape of each matrix of t, for the packed ones.
  auto add = [&](const Tensor& t, double active_fraction, int64_t n = 0, int64_t k = 0) {
    if (t.empty()) return;
    const int64_t params = params_of(t, n, k);
    s.active_params_per_token += int64_t(double(params) * active_fraction);
    s.bytes_touched_per_token += size_t(double(t.nbytes()) * active_fraction);
    if (!seen.insert(t.data).second) return;
    s.total_params += params;
    s.bytes_per_dtype[std::string(dtype_name(t.dtype))] += t.nbytes();
    s.total_bytes += t.nbytes();
    if (t.block_scales) {  // an FP8 matrix's block scales, read with it
      const size_t scale_bytes = t.block_scales->nbytes();
      s.bytes_touched_per_token += size_t(double(scale_bytes) * active_fraction);
      s.bytes_per_dtype["F32"] += scale_bytes;
      s.total_bytes += scale_bytes;
    }
  };
  add(w.embed, 1.0 / c.vocab_size);  // a token reads one row
  const double expert_fraction = double(c.experts_per_token) / c.num_experts;
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const int64_t mlp =
        c.is_moe_layer(int(l)) ? c.shared_expert_intermediate_size : c.dense_intermediate_size;
    for (const Tensor* t : layer_tensors_but_experts(L)) {
      // absent ones (empty) add nothing
      if (t == &L.mlp_gate || t == &L.mlp_up)
        add(*t, 1.0, mlp, H);
      else if (t == &L.mlp_down)
        add(*t, 1.0, H, mlp);
      else
        add(*t, 1.0);
    }
    add(L.expert_gate, expert_fraction, I, H);
    add(L.expert_up, expert_fraction, I, H);
    add(L.expert_down, expert_fraction, H, I);
    for (const Tensor* t : layer_expert_tensors(L))
      if (!t->empty())
        s.expert_bytes += t->nbytes() + (t->block_scales ? t->block_scales->nbytes() : 0);
  }
  add(w.final_norm, 1.0);
  add(w.lm_head, 1.0);
  return s;
}

ModelStats whole_model_stats(const Model& m) {
  ModelStats s = model_stats(m);
  if (!m.expert_files) return s;
  const ModelConfig& c = m.config;
  const int64_t H = c.hidden_size, I = c.expert_intermediate_size, E = c.num_experts;
  const double active = double(c.experts_per_token) / double(E);
  // One matrix of each expert as the engine holds it, by dtype (FP8's block scales in F32).
  auto add = [&](int64_t n, int64_t k) {
    const size_t bytes = size_t(E) * expert_matrix_bytes(c, n, k);
    const size_t codes = size_t(E * n * k);
    if (c.expert_quant.quantized())
      s.bytes_per_dtype["U8"] += bytes;
    else if (c.fp8_weights)
      s.bytes_per_dtype["F8_E4M3"] += codes, s.bytes_per_dtype["F32"] += bytes - codes;
    else
      s.bytes_per_dtype["BF16"] += bytes;
    s.total_params += E * n * k;
    s.active_params_per_token += int64_t(double(E * n * k) * active);
    s.bytes_touched_per_token += size_t(double(bytes) * active);
    s.total_bytes += bytes;
    s.expert_bytes += bytes;
  };
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    add(I, H);  // gate
    add(I, H);  // up
    add(H, I);  // down
  }
  return s;
}
}  // namespace sluice
