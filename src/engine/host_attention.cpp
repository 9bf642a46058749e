#include "engine/host_attention.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "model/fp8_weights.h"

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

// compressed_kv = kv_a_proj_with_mqa(h): the latent through kv_a_layernorm, k_pe rotated (one
// head shared by all); the cache keeps both, rounded to bf16.
void store_latent_kv(const ModelConfig& c, const LayerWeights& L,
                     const std::vector<float>& inv_freq, PagedKvCache& kv, int layer,
                     const HostAttentionItem& it, const int32_t* positions,
                     std::vector<float>& rows) {
  const int R = c.mla.kv_lora_rank, row = c.kv_cache_values_per_token(), n = it.count;
  rows.assign(it.k, it.k + size_t(n) * row);
  cpu::rms_norm({.x = rows.data(),
                 .y = rows.data(),
                 .rows = n,
                 .dim = R,
                 .weight = L.kv_a_norm.data,
                 .weight_dtype = DType::F32,
                 .eps = c.rms_norm_eps,
                 .x_stride = row,
                 .y_stride = row});
  latent_rope(c, inv_freq, rows.data() + R, n, 1, row, row, positions);
  kv.write_rows(layer, it.slot, it.first_pos, n, rows.data());
}

// Scratch of one query row's absorbed attention.
struct LatentRow {
  std::vector<float> q_latent, q_rope, out_latent;
};

// One query row (its q_pe rotated) at `position` over the cached positions up to it:
// q_latent = W_UKᵀ q_nope per head, attention over [latent | k_pe] with [q_latent | q_pe], the
// weighted latent sum unfolded through W_UV into out ([heads, v_head_dim]).
void attend_latent_row(const ModelConfig& c, const cpu::MlaKvB& kv_b, const float* q, int position,
                       std::span<const uint16_t* const> blocks, int block_size, LatentRow& s,
                       float* out) {
  const int heads = c.num_heads, N = c.mla.qk_nope_head_dim, P = c.mla.qk_rope_head_dim;
  const int R = c.mla.kv_lora_rank, D = c.head_dim;
  s.q_latent.resize(size_t(heads) * R);
  s.q_rope.resize(size_t(heads) * P);
  s.out_latent.resize(size_t(heads) * R);
  cpu::mla_fold_query(kv_b, q, D, s.q_latent.data());
  for (int h = 0; h < heads; ++h)
    std::copy_n(q + size_t(h) * D + N, P, s.q_rope.data() + size_t(h) * P);
  cpu::MlaDecodeArgs a;
  a.heads = heads;
  a.rank = R;
  a.rope_dim = P;
  a.positions = position + 1;  // causal: itself and every earlier position
  a.scale = c.attention_scale();
  a.blocks = blocks;
  a.block_size = block_size;
  a.q_latent = s.q_latent.data();
  a.q_rope = s.q_rope.data();
  a.out_latent = s.out_latent.data();
  cpu::mla_decode_attention(a);
  // attn_output = Σ_p w_p v_p = W_UV · Σ_p w_p c_p per head
  cpu::mla_unfold_output(kv_b, s.out_latent.data(), out);
}

}  // namespace

void host_latent_attention(const ModelConfig& c, const LayerWeights& L,
                           const std::vector<float>& inv_freq, PagedKvCache& kv, int layer,
                           std::span<const HostAttentionItem> items, EngineStats& stats) {
  const LatentAttentionShape& m = c.mla;
  const int heads = c.num_heads, D = c.head_dim, row = c.kv_cache_values_per_token();
  if (kv.config().planes != 1 || kv.config().head_dim != row)
    fail(
        "engine: layer {}: expected a latent KV cache of rows of {} (kv_lora_rank {} + "
        "qk_rope_head_dim {}), got {} planes of {}",
        layer, row, m.kv_lora_rank, m.qk_rope_head_dim, kv.config().planes, kv.config().head_dim);
  // An FP8 kv_b_proj is dequantised to bf16 once per call (one layer of a step), and every
  // row's fold and unfold read that: each row reads the whole matrix anyway.
  std::vector<uint16_t> kv_b_dequantised;
  if (L.kv_b.dtype == DType::F8_E4M3) kv_b_dequantised = matrix_bf16(L.kv_b);
  const cpu::MlaKvB kv_b{
      kv_b_dequantised.empty() ? L.kv_b.as<const uint16_t>() : kv_b_dequantised.data(), heads,
      m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim};
  std::vector<float> q, rows;
  std::vector<int32_t> positions;
  std::vector<const uint16_t*> blocks;
  LatentRow scratch;
  for (const HostAttentionItem& it : items) {
    positions.resize(size_t(it.count));
    for (int t = 0; t < it.count; ++t) positions[size_t(t)] = it.first_pos + t;
    store_latent_kv(c, L, inv_freq, kv, layer, it, positions.data(), rows);
    // q_pe of every head rotated (q_nope is folded row by row).
    q.assign(it.q, it.q + size_t(it.count) * heads * D);
    latent_rope(c, inv_freq, q.data() + m.qk_nope_head_dim, it.count, heads, D, int64_t(heads) * D,
                positions.data());
    blocks.clear();
    for (int32_t b : kv.block_table(it.slot)) blocks.push_back(kv.block_data(layer, b));
    for (int t = 0; t < it.count; ++t)
      attend_latent_row(c, kv_b, q.data() + size_t(t) * heads * D, it.first_pos + t, blocks,
                        kv.config().block_size, scratch, it.out + size_t(t) * heads * m.v_head_dim);
    account_attention(c, it.first_pos, it.count, stats);
  }
}

}  // namespace sluice
