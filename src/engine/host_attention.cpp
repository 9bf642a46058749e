#include "engine/host_attention.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

namespace sluice {

void account_attention(const ModelConfig& c, int first_pos, int count, EngineStats& stats) {
  const int kv_len = first_pos + count;
  const int window = c.sliding_window > 0 ? std::min(c.sliding_window, kv_len) : kv_len;
  stats.kv_bytes += double(window) * c.kv_cache_values_per_token() * sizeof(uint16_t);
  stats.flops += count * double(window) * c.attention_flops_per_pair();
  if (c.attention == AttentionKind::kLatent)  // the fold through W_UK and unfold through W_UV
    stats.flops += 2.0 * count * c.num_heads * double(c.mla.qk_nope_head_dim + c.mla.v_head_dim) *
                   c.mla.kv_lora_rank;
}

void host_attention(const ModelConfig& c, PagedKvCache& kv, int layer,
                    std::span<const HostAttentionItem> items, EngineStats& stats) {
  std::vector<cpu::AttentionSequence> seqs;
  seqs.reserve(items.size());
  for (const HostAttentionItem& it : items) {
    kv.write_tokens(layer, it.slot, it.first_pos, it.count, it.k, it.v);
    cpu::AttentionSequence s;
    s.q = it.q;
    s.out = it.out;
    s.n_q = it.count;
    s.q_start = it.first_pos;
    s.kv_len = it.first_pos + it.count;
    s.block_table = kv.block_table(it.slot);
    seqs.push_back(s);
    account_attention(c, it.first_pos, it.count, stats);
  }
  cpu::AttentionParams params;
  params.heads = c.num_heads;
  params.kv_heads = c.num_kv_heads;
  params.head_dim = c.head_dim;
  params.sliding_window = c.sliding_window;
  cpu::paged_attention(params, kv.layer_view(layer), seqs);
}

namespace {

// RoPE at the rows' positions on `heads` vectors of `stride` floats per row, the rope_dim()
// values from `x` on in each (MLA's q_pe after q_nope, or k_pe after the latent).
void latent_rope(const ModelConfig& c, const std::vector<float>& inv_freq, float* x, int rows,
                 int heads, int head_stride, int64_t row_stride, const int32_t* positions) {
  cpu::RopeArgs a;
  a.x = x;
  a.rows = rows;
  a.n_heads = heads;
  a.head_dim = head_stride;
  a.rotary_dim = c.rope_dim();
  a.row_stride = row_stride;
  a.positions = positions;
  a.inv_freq = inv_freq.data();
  a.interleaved = c.rope_interleaved;
  a.scale = c.rope_attention_factor();
  cpu::apply_rope(a);
}

}  // namespace

void host_latent_attention(const ModelConfig& c, const LayerWeights& L,
                           const std::vector<float>& inv_freq, PagedKvCache& kv, int layer,
                           std::span<const HostAttentionItem> items, EngineStats& stats) {
  const LatentAttentionShape& m = c.mla;
  const int R = m.kv_lora_rank, P = m.qk_rope_head_dim, N = m.qk_nope_head_dim, D = c.head_dim;
  const int heads = c.num_heads, row = R + P;
  if (kv.config().planes != 1 || kv.config().head_dim != row)
    fail("engine: layer {}: expected a latent KV cache of rows of {} (kv_lora_rank {} + "
         "qk_rope_head_dim {}), got {} planes of {}",
         layer, row, R, P, kv.config().planes, kv.config().head_dim);
  const cpu::MlaKvB kv_b{L.kv_b.as<const uint16_t>(), heads, R, N, m.v_head_dim};
  std::vector<float> q, cache_rows, q_latent(size_t(heads) * R), q_rope(size_t(heads) * P),
      out_latent(size_t(heads) * R);
  std::vector<int32_t> positions;
  std::vector<const uint16_t*> blocks;
  for (const HostAttentionItem& it : items) {
    const int n = it.count;
    positions.resize(size_t(n));
    for (int t = 0; t < n; ++t) positions[size_t(t)] = it.first_pos + t;
    // compressed_kv = kv_a_proj_with_mqa(h): the latent through kv_a_layernorm, k_pe rotated
    // (one head shared by all); the cache keeps both, rounded to bf16.
    cache_rows.assign(it.k, it.k + size_t(n) * row);
    cpu::rms_norm({.x = cache_rows.data(),
                   .y = cache_rows.data(),
                   .rows = n,
                   .dim = R,
                   .weight = L.kv_a_norm.data,
                   .weight_dtype = DType::F32,
                   .eps = c.rms_norm_eps,
                   .x_stride = row,
                   .y_stride = row});
    latent_rope(c, inv_freq, cache_rows.data() + R, n, 1, P, row, positions.data());
    kv.write_rows(layer, it.slot, it.first_pos, n, cache_rows.data());
    // q_pe of every head rotated; q_nope folded through W_UK into the latent space.
    q.assign(it.q, it.q + size_t(n) * heads * D);
    latent_rope(c, inv_freq, q.data() + N, n, heads, D, int64_t(heads) * D, positions.data());
    blocks.clear();
    for (int32_t b : kv.block_table(it.slot)) blocks.push_back(kv.block_data(layer, b));
    for (int t = 0; t < n; ++t) {
      const float* qt = q.data() + size_t(t) * heads * D;
      cpu::mla_fold_query(kv_b, qt, D, q_latent.data());
      for (int h = 0; h < heads; ++h)
        std::copy_n(qt + size_t(h) * D + N, P, q_rope.data() + size_t(h) * P);
      cpu::MlaDecodeArgs a;
      a.heads = heads;
      a.rank = R;
      a.rope_dim = P;
      a.positions = it.first_pos + t + 1;  // causal: itself and every earlier position
      a.scale = c.attention_scale();
      a.blocks = blocks;
      a.block_size = kv.config().block_size;
      a.q_latent = q_latent.data();
      a.q_rope = q_rope.data();
      a.out_latent = out_latent.data();
      cpu::mla_decode_attention(a);
      // attn_output = Σ_p w_p v_p = W_UV · Σ_p w_p c_p per head
      cpu::mla_unfold_output(kv_b, out_latent.data(), it.out + size_t(t) * heads * m.v_head_dim);
    }
    account_attention(c, it.first_pos, it.count, stats);
  }
}

}  // namespace sluice
