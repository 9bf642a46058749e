#include "gguf_test_writer.h"

#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "io/gguf_quantize.h"

namespace sluice::testing {

void round_trip_quantized(Model& m, GgufWeights weights) {
  auto round_trip = [&](Tensor& t) {
    if (t.empty() || !stored_quantized(t.shape)) return;
    std::vector<float> x(size_t(t.numel()));
    to_f32(t.dtype, t.data, x.data(), x.size());
    const auto q = weights == GgufWeights::kQ8_0 ? quantize_q8_0(x.data(), int64_t(x.size()))
                                                 : quantize_q4_0(x.data(), int64_t(x.size()));
    dequantize(uint32_t(weights == GgufWeights::kQ8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0), q.data(),
               x.data(), int64_t(x.size()));
    Tensor out = Tensor::allocate(DType::BF16, t.shape);
    for (size_t i = 0; i < x.size(); ++i) out.as<uint16_t>()[i] = f32_to_bf16(x[i]);
    t = std::move(out);
  };
  // The file holds kv_b split (attn_k_b rows of qk_nope values, attn_v_b of kv_lora_rank);
  // quantising kv_b whole is the same only while neither is whole blocks.
  const LatentAttentionShape& mla = m.config.mla;
  if (m.config.attention == AttentionKind::kLatent &&
      (mla.qk_nope_head_dim % 32 == 0 || mla.kv_lora_rank % 32 == 0))
    throw Error("round_trip_quantized: a quantised split kv_b is not modelled");
  ModelWeights& w = m.weights;
  round_trip(w.embed);
  for (LayerWeights& L : w.layers)
    for (Tensor* t :
         {&L.attn_norm, &L.wq,          &L.wk,          &L.wv,        &L.wo,          &L.bq,
          &L.bk,        &L.bv,          &L.bo,          &L.q_norm,    &L.k_norm,      &L.q_a,
          &L.q_a_norm,  &L.q_b,         &L.kv_a,        &L.kv_a_norm, &L.kv_b,        &L.ffn_norm,
          &L.router,    &L.router_bias, &L.expert_gate, &L.expert_up, &L.expert_down, &L.mlp_gate,
          &L.mlp_up,    &L.mlp_down,    &L.mlp_scale})
      round_trip(*t);
  round_trip(w.final_norm);
  if (m.config.tie_word_embeddings)
    w.lm_head = w.embed;
  else
    round_trip(w.lm_head);
}

}  // namespace sluice::testing
