#include "model/model_stats.h"

#include <set>

namespace sluice {

ModelStats model_stats(const Model& m) {
  ModelStats s;
  const ModelConfig& c = m.config;
  const ModelWeights& w = m.weights;
  std::set<const void*> seen;  // tied embeddings count once
  auto add = [&](const Tensor& t, double active_fraction) {
    if (t.empty()) return;
    const int64_t active = int64_t(double(t.numel()) * active_fraction);
    s.active_params_per_token += active;
    s.bytes_touched_per_token += size_t(active) * dtype_size(t.dtype);
    if (!seen.insert(t.data).second) return;
    s.total_params += t.numel();
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
  for (const LayerWeights& L : w.layers) {
    for (const Tensor* t : layer_tensors_but_experts(L))
      add(*t, 1.0);  // absent ones (empty) add nothing
    for (const Tensor* t : layer_expert_tensors(L)) {
      add(*t, expert_fraction);
      s.expert_bytes += t->nbytes();
    }
  }
  add(w.final_norm, 1.0);
  add(w.lm_head, 1.0);
  return s;
}

}  // namespace sluice
