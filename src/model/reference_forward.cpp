// Each block below mirrors a piece of transformers' modeling_mixtral.py; the PyTorch line it
// transcribes is quoted in the comment above it.
#include "model/reference_forward.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace sluice {

namespace {

void round_to_bf16(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

// y[rows, out] = x[rows, in] · Wᵀ, W stored [out, in] in any float dtype; fp32 accumulation.
// With `bf16_input` the activations are first rounded to bf16, as a bf16 GEMM sees them.
void linear(const float* x_in, int rows, const Tensor& w, float* y, bool bf16_input) {
  const int64_t out = w.shape[0], in = w.shape[1];
  std::vector<float> rounded;
  const float* x = x_in;
  if (bf16_input) {
    rounded.assign(x_in, x_in + size_t(rows) * in);
    round_to_bf16(rounded.data(), rounded.size());
    x = rounded.data();
  }
  const size_t row_bytes = size_t(in) * dtype_size(w.dtype);
#pragma omp parallel
  {
    std::vector<float> wrow(in);
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      to_f32(w.dtype, static_cast<const char*>(w.data) + o * row_bytes, wrow.data(), in);
      for (int r = 0; r < rows; ++r) {
        const float* xr = x + size_t(r) * in;
        float acc = 0.f;
        for (int64_t i = 0; i < in; ++i) acc += xr[i] * wrow[i];
        y[size_t(r) * out + o] = acc;
      }
    }
  }
}

std::vector<float> weight_f32(const Tensor& t) {
  std::vector<float> v(t.numel());
  to_f32(t.dtype, t.data, v.data(), v.size());
  return v;
}

// variance = hidden.pow(2).mean(-1, keepdim=True); hidden * rsqrt(variance + eps) * weight
void rms_norm(const float* x, int rows, int dim, const std::vector<float>& w, float eps, float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * dim;
    float ss = 0.f;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    float scale = 1.0f / std::sqrt(ss / float(dim) + eps);
    for (int i = 0; i < dim; ++i) y[size_t(r) * dim + i] = w[i] * (xr[i] * scale);
  }
}

// q * cos + rotate_half(q) * sin, with cos/sin of cat(freqs, freqs) and
// inv_freq = 1 / theta^(arange(0, d, 2) / d), all in fp32 as in MixtralRotaryEmbedding.
void apply_rope(float* x, int num_heads, int head_dim, int position, float theta) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(head_dim));
    float angle = float(position) * inv_freq;
    float c = std::cos(angle), s = std::sin(angle);
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + size_t(h) * head_dim;
      float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

}  // namespace

ReferenceForward::ReferenceForward(const Model& model, ReferenceOptions options)
    : model_(model),
      options_(options),
      k_cache_(model.config.num_layers),
      v_cache_(model.config.num_layers) {}

std::vector<float> ReferenceForward::forward(std::span<const int> tokens, const DumpFn& dump) {
  const ModelConfig& c = model_.config;
  const ModelWeights& w = model_.weights;
  const int T = int(tokens.size()), H = c.hidden_size, D = c.head_dim;
  const int qd = c.q_dim(), kvd = c.kv_dim(), group = c.num_heads / c.num_kv_heads;
  const int E = c.num_experts, I = c.expert_intermediate_size;
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

  std::vector<float> h(size_t(T) * H), q(size_t(T) * qd), k(size_t(T) * kvd), v(size_t(T) * kvd);
  std::vector<float> attn(size_t(T) * qd), o(size_t(T) * H), logits_r(size_t(T) * E);
  std::vector<float> moe(size_t(T) * H), gate(I), up(I), down(H);
  const float scale = 1.0f / std::sqrt(float(D));
  const bool bf16 = options_.bf16_gemm_inputs;

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    // hidden_states = self.input_layernorm(hidden_states)
    rms_norm(x.data(), T, H, weight_f32(L.attn_norm), c.rms_norm_eps, h.data());
    linear(h.data(), T, L.wq, q.data(), bf16);
    linear(h.data(), T, L.wk, k.data(), bf16);
    linear(h.data(), T, L.wv, v.data(), bf16);
    for (int t = 0; t < T; ++t) {
      apply_rope(&q[size_t(t) * qd], c.num_heads, D, length_ + t, c.rope_theta);
      apply_rope(&k[size_t(t) * kvd], c.num_kv_heads, D, length_ + t, c.rope_theta);
    }
    if (options_.bf16_kv_cache) {
      round_to_bf16(k.data(), k.size());
      round_to_bf16(v.data(), v.size());
    }
    auto& kc = k_cache_[l];
    auto& vc = v_cache_[l];
    kc.insert(kc.end(), k.begin(), k.end());
    vc.insert(vc.end(), v.begin(), v.end());

    // softmax(q·kᵀ / sqrt(d) + causal (and sliding-window) mask) · v, per head; query head
    // `hq` reads KV head hq / (heads / kv_heads) (repeat_kv). The window is masking_utils'
    // sliding_window_overlay, kv_idx > q_idx - sliding_window: `sliding_window` keys, self
    // included.
    for (int t = 0; t < T; ++t) {
      const int pos = length_ + t;
      const int first = c.sliding_window > 0 ? std::max(0, pos - c.sliding_window + 1) : 0;
      std::vector<float> scores(pos + 1);
      for (int hq = 0; hq < c.num_heads; ++hq) {
        const float* qv = &q[size_t(t) * qd + size_t(hq) * D];
        const int kvh = hq / group;
        float max_score = -INFINITY;
        for (int p = first; p <= pos; ++p) {
          const float* kv = &kc[size_t(p) * kvd + size_t(kvh) * D];
          float s = 0.f;
          for (int d = 0; d < D; ++d) s += qv[d] * kv[d];
          scores[p] = s * scale;
          max_score = std::max(max_score, scores[p]);
        }
        float sum = 0.f;
        for (int p = first; p <= pos; ++p) sum += (scores[p] = std::exp(scores[p] - max_score));
        float* out = &attn[size_t(t) * qd + size_t(hq) * D];
        std::fill(out, out + D, 0.f);
        for (int p = first; p <= pos; ++p) {
          const float* vv = &vc[size_t(p) * kvd + size_t(kvh) * D];
          const float pw = scores[p] / sum;
          for (int d = 0; d < D; ++d) out[d] += pw * vv[d];
        }
      }
    }
    // attn_output = self.o_proj(attn_output); hidden_states = residual + hidden_states
    linear(attn.data(), T, L.wo, o.data(), bf16);
    emit(fmt::format("layer.{}.attn_out", l), o, H);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];

    // MixtralSparseMoeBlock: router_logits = self.gate(hidden_states);
    // routing_weights = softmax(router_logits, dim=1); topk; routing_weights /= sum
    rms_norm(x.data(), T, H, weight_f32(L.ffn_norm), c.rms_norm_eps, h.data());
    linear(h.data(), T, L.router, logits_r.data(), /*bf16_input=*/false);  // fp32, as sluice routes
    std::fill(moe.begin(), moe.end(), 0.f);
    for (int t = 0; t < T; ++t) {
      const float* rl = &logits_r[size_t(t) * E];
      float m = *std::max_element(rl, rl + E), sum = 0.f;
      std::vector<float> prob(E);
      for (int e = 0; e < E; ++e) sum += (prob[e] = std::exp(rl[e] - m));
      for (int e = 0; e < E; ++e) prob[e] /= sum;
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
      float topk_sum = 0.f;
      for (int j = 0; j < c.experts_per_token; ++j) topk_sum += prob[order[j]];
      const float* xt = &h[size_t(t) * H];
      for (int j = 0; j < c.experts_per_token; ++j) {
        const int e = order[j];
        const float weight = c.normalize_topk ? prob[e] / topk_sum : prob[e];
        // current_hidden_states = self.w2(self.act_fn(self.w1(x)) * self.w3(x))
        linear(xt, 1, L.expert_gate.slice0(e), gate.data(), bf16);
        linear(xt, 1, L.expert_up.slice0(e), up.data(), bf16);
        for (int i = 0; i < I; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
        linear(gate.data(), 1, L.expert_down.slice0(e), down.data(), bf16);
        for (int d = 0; d < H; ++d) moe[size_t(t) * H + d] += weight * down[d];
      }
    }
    emit(fmt::format("layer.{}.moe_out", l), moe, H);
    for (size_t i = 0; i < x.size(); ++i) x[i] += moe[i];
    emit(fmt::format("layer.{}.out", l), x, H);
  }
  length_ += T;

  rms_norm(x.data(), T, H, weight_f32(w.final_norm), c.rms_norm_eps, h.data());
  emit("final_norm", h, H);
  std::vector<float> logits(size_t(T) * c.vocab_size);
  linear(h.data(), T, w.lm_head, logits.data(), bf16);
  emit("logits", logits, c.vocab_size);
  return logits;
}

}  // namespace sluice
