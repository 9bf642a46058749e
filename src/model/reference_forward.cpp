// Each block below mirrors a piece of transformers' modeling code (Mixtral's, with the features
// other families add where their config or their optional weights say so); the PyTorch line it
// transcribes is quoted in the comment above it.
#include "model/reference_forward.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/gemm_fp8.h"
#include "model/expert_quant.h"
#include "model/fp8_weights.h"

namespace sluice {

namespace {

void round_to_bf16(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

std::vector<float> weight_f32(const Tensor& t) {
  std::vector<float> v(t.numel());
  to_f32(t.dtype, t.data, v.data(), v.size());
  return v;
}

// Row o of W [out, in] as fp32: FP8 codes times their block's scale, rounded to bf16 as the
// checkpoint's dequantisation does (kernels/cpu/gemm_fp8.h), other dtypes widened.
void weight_row(const Tensor& w, int64_t o, size_t row_bytes, float* out) {
  const int64_t in = w.shape[1];
  if (w.dtype != DType::F8_E4M3) {
    to_f32(w.dtype, static_cast<const char*>(w.data) + o * row_bytes, out, size_t(in));
    return;
  }
  std::vector<uint16_t> row(static_cast<size_t>(in));
  cpu::dequantize_fp8_scalar(fp8_matrix(w), o, 1, 0, in, row.data(), in);
  for (int64_t i = 0; i < in; ++i) out[i] = bf16_to_f32(row[size_t(i)]);
}

// y[rows, out] = x[rows, in] · Wᵀ (+ bias), W stored [out, in] in any float dtype; fp32
// accumulation. With `bf16_input` the activations are first rounded to bf16, as a bf16 GEMM
// sees them.
void linear(const float* x_in, int rows, const Tensor& w, float* y, bool bf16_input,
            const Tensor& bias = {}) {
  const int64_t out = w.shape[0], in = w.shape[1];
  std::vector<float> rounded;
  const float* x = x_in;
  if (bf16_input) {
    rounded.assign(x_in, x_in + size_t(rows) * in);
    round_to_bf16(rounded.data(), rounded.size());
    x = rounded.data();
  }
  const std::vector<float> b = bias.empty() ? std::vector<float>(size_t(out)) : weight_f32(bias);
  const size_t row_bytes = size_t(in) * dtype_size(w.dtype);
#pragma omp parallel
  {
    std::vector<float> wrow(in);
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      weight_row(w, o, row_bytes, wrow.data());
      for (int r = 0; r < rows; ++r) {
        const float* xr = x + size_t(r) * in;
        float acc = 0.f;
        for (int64_t i = 0; i < in; ++i) acc += xr[i] * wrow[i];
        y[size_t(r) * out + o] = acc + b[size_t(o)];
      }
    }
  }
}

// RMSNorm: variance = hidden.pow(2).mean(-1, keepdim=True); hidden * rsqrt(variance + eps) * w
// LayerNorm without bias: (hidden - mean) * rsqrt(var + eps) * w, var the biased variance.
// Over `rows` rows of `dim`; y may equal x.
void norm(NormKind kind, const float* x, int rows, int dim, const std::vector<float>& w, float eps,
          float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * dim;
    float mean = 0.f;
    if (kind == NormKind::kLayerNorm) {
      for (int i = 0; i < dim; ++i) mean += xr[i];
      mean /= float(dim);
    }
    float ss = 0.f;
    for (int i = 0; i < dim; ++i) ss += (xr[i] - mean) * (xr[i] - mean);
    const float scale = 1.0f / std::sqrt(ss / float(dim) + eps);
    for (int i = 0; i < dim; ++i) y[size_t(r) * dim + i] = w[i] * ((xr[i] - mean) * scale);
  }
}

void rms_norm(const float* x, int rows, int dim, const std::vector<float>& w, float eps, float* y) {
  norm(NormKind::kRms, x, rows, dim, w, eps, y);
}

// Rotates the last rope_dim() values of each of `num_heads` vectors of `stride` floats at
// `position`: cos and sin of position · inv_freq, times YaRN's attention factor. Pairs
// (x[i], x[i + d/2]) as q * cos + rotate_half(q) * sin, or with rope_interleaved the adjacent
// pairs (x[2i], x[2i + 1]) as DeepSeek's complex product (and V3's interleave permutation,
// which gives the same dot products).
void apply_rope(const ModelConfig& c, const std::vector<float>& inv_freq, float* x, int num_heads,
                int stride, int position) {
  const int d = c.rope_dim(), half = d / 2;
  const float factor = c.rope_attention_factor();
  for (int i = 0; i < half; ++i) {
    const float angle = float(position) * inv_freq[size_t(i)];
    const float cs = std::cos(angle) * factor, sn = std::sin(angle) * factor;
    const int ia = c.rope_interleaved ? 2 * i : i, ib = c.rope_interleaved ? 2 * i + 1 : i + half;
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + size_t(h) * stride + (stride - d);
      const float a = v[ia], b = v[ib];
      v[ia] = a * cs - b * sn;
      v[ib] = b * cs + a * sn;
    }
  }
}

// The RMSNorm on q or k ([T, heads·head_dim]): over each head (Qwen3: q_norm(q.view(..., -1,
// head_dim))) or over the whole row (OLMoE: q_norm(q_proj(x))).
void qk_norm(const ModelConfig& c, const Tensor& weight, int T, int heads, float* x) {
  if (weight.empty()) return;
  const std::vector<float> w = weight_f32(weight);
  if (c.qk_norm == QkNorm::kPerHead)
    rms_norm(x, T * heads, c.head_dim, w, c.rms_norm_eps, x);
  else
    rms_norm(x, T, heads * c.head_dim, w, c.rms_norm_eps, x);
}

// x.clamp_(min=-clip_qkv, max=clip_qkv)
void clip(std::vector<float>& x, float limit) {
  if (limit <= 0) return;
  for (float& v : x) v = std::clamp(v, -limit, limit);
}

// down(silu(gate(x)) * up(x)) for one row.
void swiglu(const float* x, const Tensor& gate_w, const Tensor& up_w, const Tensor& down_w,
            bool bf16, float* out) {
  const int64_t I = gate_w.shape[0];
  std::vector<float> gate(static_cast<size_t>(I)), up(static_cast<size_t>(I));
  linear(x, 1, gate_w, gate.data(), bf16);
  linear(x, 1, up_w, up.data(), bf16);
  for (int64_t i = 0; i < I; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  linear(gate.data(), 1, down_w, out, bf16);
}

// The group-limited stage: experts outside the best groups_per_token groups (each group scored
// by its best expert or by the sum of its best two) get choice 0, as masked_fill(~mask, 0.0).
void mask_groups(const ModelConfig& c, std::vector<float>& choice) {
  const int G = c.expert_groups, per_group = c.num_experts / G;
  std::vector<float> group_score(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) {
    std::vector<float> members(choice.begin() + g * per_group,
                               choice.begin() + (g + 1) * per_group);
    std::sort(members.begin(), members.end(), std::greater<float>());
    group_score[size_t(g)] =
        c.group_score == GroupScore::kMax ? members[0] : members[0] + members[1];
  }
  std::vector<int> groups(static_cast<size_t>(G));
  std::iota(groups.begin(), groups.end(), 0);
  std::stable_sort(groups.begin(), groups.end(),
                   [&](int a, int b) { return group_score[size_t(a)] > group_score[size_t(b)]; });
  std::vector<bool> kept(static_cast<size_t>(G), false);
  for (int j = 0; j < c.groups_per_token; ++j) kept[size_t(groups[size_t(j)])] = true;
  for (int e = 0; e < c.num_experts; ++e)
    if (!kept[size_t(e / per_group)]) choice[size_t(e)] = 0.0f;
}

// scores = softmax(router_logits) (Mixtral, Qwen, DeepSeek-V2) or sigmoid(router_logits)
// (DeepSeek-V3), in fp32.
std::vector<float> router_scores(const ModelConfig& c, std::span<const float> logits) {
  const int E = c.num_experts;
  std::vector<float> score(static_cast<size_t>(E));
  if (c.router_score == RouterScore::kSigmoid) {
    for (int e = 0; e < E; ++e) score[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[size_t(e)]));
  } else {
    float m = *std::max_element(logits.begin(), logits.end()), sum = 0.f;
    for (int e = 0; e < E; ++e) sum += (score[size_t(e)] = std::exp(logits[size_t(e)] - m));
    for (float& p : score) p /= sum;
  }
  return score;
}

// The weights of the chosen experts: their plain scores, renormalised over the choice when
// normalize_topk, times routed_scaling_factor. Returns the (expert, weight) pairs.
std::vector<std::pair<int, float>> expert_weights(const ModelConfig& c,
                                                  std::span<const float> logits,
                                                  std::span<const int> experts) {
  const std::vector<float> score = router_scores(c, logits);
  float topk_sum = 0.f;
  for (int e : experts) topk_sum += score[size_t(e)];
  std::vector<std::pair<int, float>> picked;
  for (int e : experts) {
    const float w = c.normalize_topk ? score[size_t(e)] / topk_sum : score[size_t(e)];
    picked.push_back({e, w * c.routed_scaling_factor});
  }
  return picked;
}

// The experts the teacher-forcing callback chooses for decision `d`, checked: experts_per_token
// distinct experts.
std::vector<int> forced_choice(const ModelConfig& c, const ExpertChoiceFn& choose,
                               const RouterDecision& d) {
  std::vector<int> experts = choose(d);
  std::vector<int> sorted = experts;
  std::sort(sorted.begin(), sorted.end());
  const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  if (int(experts.size()) != c.experts_per_token || !distinct || sorted.front() < 0 ||
      sorted.back() >= c.num_experts)
    fail("reference: the teacher-forced routing gave layer {} position {} the experts [{}]; "
         "expected {} distinct ids in [0, {})",
         d.layer, d.position, fmt::join(experts, ", "), c.experts_per_token, c.num_experts);
  return experts;
}

}  // namespace

// The scores plus the selection bias (e_score_correction_bias), masked to the best groups, their
// top-k; ties go to the lower id.
std::vector<int> select_experts(const ModelConfig& c, const LayerWeights& L,
                                std::span<const float> logits) {
  const int E = c.num_experts;
  std::vector<float> choice = router_scores(c, logits);
  if (!L.router_bias.empty()) {
    const std::vector<float> bias = weight_f32(L.router_bias);
    for (int e = 0; e < E; ++e) choice[size_t(e)] += bias[size_t(e)];
  }
  if (c.expert_groups > 1) mask_groups(c, choice);
  std::vector<int> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return choice[size_t(a)] > choice[size_t(b)]; });
  order.resize(size_t(c.experts_per_token));
  return order;
}

ReferenceForward::ReferenceForward(const Model& model, ReferenceOptions options)
    : model_(model),
      options_(options),
      k_cache_(model.config.num_layers),
      v_cache_(model.config.num_layers),
      inv_freq_(rope_inv_freq(model.config)) {}

// hidden_states = residual + self_attn(input_layernorm(hidden_states))
void ReferenceForward::attention_block(int l, int T, std::vector<float>& x, const DumpFn& dump) {
  const ModelConfig& c = model_.config;
  const LayerWeights& L = model_.weights.layers[size_t(l)];
  const int H = c.hidden_size, D = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim();
  const int group = c.num_heads / c.num_kv_heads;
  const bool bf16 = options_.bf16_gemm_inputs;
  std::vector<float> h(size_t(T) * H), q(size_t(T) * qd), k(size_t(T) * kvd), v(size_t(T) * kvd);
  std::vector<float> attn(size_t(T) * qd), o(size_t(T) * H);

  norm(c.norm, x.data(), T, H, weight_f32(L.attn_norm), c.rms_norm_eps, h.data());
  // q = q_proj(h) (+ bias); q_norm; clamp(±clip_qkv); RoPE. The same for k; v is clamped only.
  linear(h.data(), T, L.wq, q.data(), bf16, L.bq);
  linear(h.data(), T, L.wk, k.data(), bf16, L.bk);
  linear(h.data(), T, L.wv, v.data(), bf16, L.bv);
  qk_norm(c, L.q_norm, T, c.num_heads, q.data());
  qk_norm(c, L.k_norm, T, c.num_kv_heads, k.data());
  clip(q, c.clip_qkv);
  clip(k, c.clip_qkv);
  clip(v, c.clip_qkv);
  for (int t = 0; t < T; ++t) {
    apply_rope(c, inv_freq_, &q[size_t(t) * qd], c.num_heads, D, length_ + t);
    apply_rope(c, inv_freq_, &k[size_t(t) * kvd], c.num_kv_heads, D, length_ + t);
  }
  if (options_.bf16_kv_cache) {
    round_to_bf16(k.data(), k.size());
    round_to_bf16(v.data(), v.size());
  }
  auto& kc = k_cache_[size_t(l)];
  auto& vc = v_cache_[size_t(l)];
  kc.insert(kc.end(), k.begin(), k.end());
  vc.insert(vc.end(), v.begin(), v.end());

  // softmax(q·kᵀ / sqrt(d) + causal (and sliding-window) mask) · v, per head; query head
  // `hq` reads KV head hq / (heads / kv_heads) (repeat_kv). The window is masking_utils'
  // sliding_window_overlay, kv_idx > q_idx - sliding_window: `sliding_window` keys, self
  // included.
  const float scale = c.attention_scale();
  for (int t = 0; t < T; ++t) {
    const int pos = length_ + t;
    const int first = c.sliding_window > 0 ? std::max(0, pos - c.sliding_window + 1) : 0;
    std::vector<float> scores(size_t(pos) + 1);
    for (int hq = 0; hq < c.num_heads; ++hq) {
      const float* qv = &q[size_t(t) * qd + size_t(hq) * D];
      const int kvh = hq / group;
      float max_score = -INFINITY;
      for (int p = first; p <= pos; ++p) {
        const float* kv = &kc[size_t(p) * kvd + size_t(kvh) * D];
        float s = 0.f;
        for (int d = 0; d < D; ++d) s += qv[d] * kv[d];
        scores[size_t(p)] = s * scale;
        max_score = std::max(max_score, scores[size_t(p)]);
      }
      float sum = 0.f;
      for (int p = first; p <= pos; ++p)
        sum += (scores[size_t(p)] = std::exp(scores[size_t(p)] - max_score));
      float* out = &attn[size_t(t) * qd + size_t(hq) * D];
      std::fill(out, out + D, 0.f);
      for (int p = first; p <= pos; ++p) {
        const float* vv = &vc[size_t(p) * kvd + size_t(kvh) * D];
        const float pw = scores[size_t(p)] / sum;
        for (int d = 0; d < D; ++d) out[d] += pw * vv[d];
      }
    }
  }
  // attn_output = self.o_proj(attn_output); hidden_states = residual + hidden_states
  linear(attn.data(), T, L.wo, o.data(), bf16, L.bo);
  if (dump) dump(fmt::format("layer.{}.attn_out", l), o.data(), T, H);
  for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
}

// DeepseekV{2,3}Attention's query: q_proj(h), or q_b_proj(q_a_layernorm(q_a_proj(h))); split per
// head into q_nope and q_pe, RoPE on q_pe.
std::vector<float> ReferenceForward::latent_query(const LayerWeights& L,
                                                  const std::vector<float>& h, int T) {
  const ModelConfig& c = model_.config;
  const bool bf16 = options_.bf16_gemm_inputs;
  const int qd = c.q_dim();
  std::vector<float> q(size_t(T) * qd);
  if (c.mla.q_lora_rank > 0) {
    const int R = c.mla.q_lora_rank;
    std::vector<float> qa(size_t(T) * R);
    linear(h.data(), T, L.q_a, qa.data(), bf16);
    rms_norm(qa.data(), T, R, weight_f32(L.q_a_norm), c.rms_norm_eps, qa.data());
    linear(qa.data(), T, L.q_b, q.data(), bf16);
  } else {
    linear(h.data(), T, L.wq, q.data(), bf16);
  }
  for (int t = 0; t < T; ++t)
    apply_rope(c, inv_freq_, &q[size_t(t) * qd], c.num_heads, c.head_dim, length_ + t);
  return q;
}

// compressed_kv = kv_a_proj_with_mqa(h), split into the latent and k_pe; k_pe gets RoPE (one
// head, shared by all); kv_b_proj(kv_a_layernorm(latent)) splits per head into k_nope and v.
void ReferenceForward::append_latent_kv(int l, const std::vector<float>& h, int T) {
  const ModelConfig& c = model_.config;
  const LayerWeights& L = model_.weights.layers[size_t(l)];
  const LatentAttentionShape& m = c.mla;
  const int R = m.kv_lora_rank, P = m.qk_rope_head_dim, N = m.qk_nope_head_dim, V = m.v_head_dim;
  const int heads = c.num_heads;
  std::vector<float> ckv(size_t(T) * (R + P)), latent(size_t(T) * R);
  std::vector<float> kv(size_t(T) * heads * (N + V));
  linear(h.data(), T, L.kv_a, ckv.data(), options_.bf16_gemm_inputs);
  for (int t = 0; t < T; ++t) {
    float* row = &ckv[size_t(t) * (R + P)];
    rms_norm(row, 1, R, weight_f32(L.kv_a_norm), c.rms_norm_eps, &latent[size_t(t) * R]);
    apply_rope(c, inv_freq_, row + R, 1, P, length_ + t);
  }
  // What a latent cache holds: the normalised latent and the rotated k_pe.
  if (options_.bf16_kv_cache) {
    round_to_bf16(latent.data(), latent.size());
    for (int t = 0; t < T; ++t) round_to_bf16(&ckv[size_t(t) * (R + P) + R], size_t(P));
  }
  linear(latent.data(), T, L.kv_b, kv.data(), options_.bf16_gemm_inputs);
  auto& kc = k_cache_[size_t(l)];
  auto& vc = v_cache_[size_t(l)];
  for (int t = 0; t < T; ++t) {
    const float* k_pe = &ckv[size_t(t) * (R + P) + R];
    for (int hd = 0; hd < heads; ++hd) {
      const float* head = &kv[(size_t(t) * heads + hd) * (N + V)];
      kc.insert(kc.end(), head, head + N);
      kc.insert(kc.end(), k_pe, k_pe + P);
      vc.insert(vc.end(), head + N, head + N + V);
    }
  }
}

// Multi-head latent attention, in the plain (decompressed) form transformers computes:
// softmax(cat(q_nope, q_pe) · cat(k_nope, k_pe)ᵀ × scaling + causal mask) · v per head, then
// o_proj; scaling is qk_head_dim^-0.5 with YaRN's mscale² correction.
void ReferenceForward::latent_attention_block(int l, int T, std::vector<float>& x,
                                              const DumpFn& dump) {
  const ModelConfig& c = model_.config;
  const LayerWeights& L = model_.weights.layers[size_t(l)];
  const int H = c.hidden_size, D = c.head_dim, V = c.mla.v_head_dim, heads = c.num_heads;
  std::vector<float> h(size_t(T) * H), o(size_t(T) * H);
  std::vector<float> attn(size_t(T) * heads * V, 0.f);
  norm(c.norm, x.data(), T, H, weight_f32(L.attn_norm), c.rms_norm_eps, h.data());
  const std::vector<float> q = latent_query(L, h, T);
  append_latent_kv(l, h, T);
  const auto& kc = k_cache_[size_t(l)];
  const auto& vc = v_cache_[size_t(l)];
  const float scale = c.attention_scale();
  for (int t = 0; t < T; ++t) {
    const int pos = length_ + t;
    std::vector<float> scores(size_t(pos) + 1);
    for (int hq = 0; hq < heads; ++hq) {
      const float* qv = &q[(size_t(t) * heads + hq) * D];
      float max_score = -INFINITY;
      for (int p = 0; p <= pos; ++p) {
        const float* kv = &kc[(size_t(p) * heads + hq) * D];
        float s = 0.f;
        for (int d = 0; d < D; ++d) s += qv[d] * kv[d];
        scores[size_t(p)] = s * scale;
        max_score = std::max(max_score, scores[size_t(p)]);
      }
      float sum = 0.f;
      for (int p = 0; p <= pos; ++p)
        sum += (scores[size_t(p)] = std::exp(scores[size_t(p)] - max_score));
      float* out = &attn[(size_t(t) * heads + hq) * V];
      for (int p = 0; p <= pos; ++p) {
        const float* vv = &vc[(size_t(p) * heads + hq) * V];
        const float pw = scores[size_t(p)] / sum;
        for (int d = 0; d < V; ++d) out[d] += pw * vv[d];
      }
    }
  }
  linear(attn.data(), T, L.wo, o.data(), options_.bf16_gemm_inputs);
  if (dump) dump(fmt::format("layer.{}.attn_out", l), o.data(), T, H);
  for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
}

// hidden_states = residual + mlp(post_attention_layernorm(hidden_states)), the mlp being the
// sparse MoE block (MixtralSparseMoeBlock; with Qwen2-MoE's shared expert, scaled by
// sigmoid(shared_expert_gate(x)), added) or, in a dense layer, a SwiGLU MLP.
void ReferenceForward::ffn_block(int l, int T, std::vector<float>& x, const DumpFn& dump) {
  const ModelConfig& c = model_.config;
  const LayerWeights& L = model_.weights.layers[size_t(l)];
  const int H = c.hidden_size, E = c.num_experts;
  const bool bf16 = options_.bf16_gemm_inputs;
  std::vector<float> h(size_t(T) * H), out(size_t(T) * H, 0.f), down(static_cast<size_t>(H));
  norm(c.norm, x.data(), T, H, weight_f32(L.ffn_norm), c.rms_norm_eps, h.data());
  std::vector<float> router_logits;
  if (!L.router.empty()) {
    router_logits.resize(size_t(T) * E);
    linear(h.data(), T, L.router, router_logits.data(), /*bf16_input=*/false);  // fp32, as sluice
  }
  for (int t = 0; t < T; ++t) {
    const float* xt = &h[size_t(t) * H];
    float* yt = &out[size_t(t) * H];
    if (!L.router.empty()) {
      const std::span<const float> logits(&router_logits[size_t(t) * E], size_t(E));
      std::vector<int> experts = select_experts(c, L, logits);
      if (choose_experts_)
        experts = forced_choice(c, choose_experts_, {l, length_ + t, logits, experts});
      for (auto [e, weight] : expert_weights(c, logits, experts)) {
        // current_hidden_states = expert(x) * routing_weights; index_add_
        const int64_t I = c.expert_intermediate_size;
        swiglu(xt, expert_matrix_f32(c, L.expert_gate, e, I, H),
               expert_matrix_f32(c, L.expert_up, e, I, H),
               expert_matrix_f32(c, L.expert_down, e, H, I), bf16, down.data());
        for (int d = 0; d < H; ++d) yt[d] += weight * down[size_t(d)];
      }
    }
    if (!L.mlp_gate.empty()) {
      float scale = 1.0f;
      if (!L.mlp_scale.empty()) {  // F.sigmoid(self.shared_expert_gate(x)), fp32 as the router
        float logit = 0.f;
        linear(xt, 1, L.mlp_scale, &logit, /*bf16_input=*/false);
        scale = 1.0f / (1.0f + std::exp(-logit));
      }
      const int64_t I = c.dense_mlp_size(l);
      swiglu(xt, expert_matrix_f32(c, L.mlp_gate, -1, I, H),
             expert_matrix_f32(c, L.mlp_up, -1, I, H), expert_matrix_f32(c, L.mlp_down, -1, H, I),
             bf16, down.data());
      for (int d = 0; d < H; ++d) yt[d] += scale * down[size_t(d)];
    }
  }
  if (dump) dump(fmt::format("layer.{}.moe_out", l), out.data(), T, H);
  for (size_t i = 0; i < x.size(); ++i) x[i] += out[i];
}

std::vector<float> ReferenceForward::forward(std::span<const int> tokens, const DumpFn& dump) {
  const ModelConfig& c = model_.config;
  const ModelWeights& w = model_.weights;
  const int T = int(tokens.size()), H = c.hidden_size;
  auto emit = [&](const std::string& name, const std::vector<float>& v, int cols) {
    if (dump) dump(name, v.data(), T, cols);
  };

  // inputs_embeds = self.embed_tokens(input_ids)
  std::vector<float> x(size_t(T) * H);
  const size_t embed_row = size_t(H) * dtype_size(w.embed.dtype);
  for (int t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size)
      fail("token id {} at position {} is outside the vocabulary [0, {})", tokens[t], t,
           c.vocab_size);
    to_f32(w.embed.dtype, static_cast<const char*>(w.embed.data) + tokens[t] * embed_row,
           &x[size_t(t) * H], H);
  }
  emit("embed", x, H);

  for (int l = 0; l < c.num_layers; ++l) {
    if (c.attention == AttentionKind::kLatent)
      latent_attention_block(l, T, x, dump);
    else
      attention_block(l, T, x, dump);
    ffn_block(l, T, x, dump);
    emit(fmt::format("layer.{}.out", l), x, H);
  }
  length_ += T;

  std::vector<float> h(size_t(T) * H);
  norm(c.norm, x.data(), T, H, weight_f32(w.final_norm), c.rms_norm_eps, h.data());
  emit("final_norm", h, H);
  std::vector<float> logits(size_t(T) * c.vocab_size);
  linear(h.data(), T, w.lm_head, logits.data(), options_.bf16_gemm_inputs);
  emit("logits", logits, c.vocab_size);
  return logits;
}

}  // namespace sluice
