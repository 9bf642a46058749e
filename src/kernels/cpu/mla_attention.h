// Decode attention of multi-head latent attention (DeepSeek-V2/V3) in the absorbed form, over
// a paged bf16 cache that holds per token only the latent c (kv_lora_rank values, after
// kv_a_layernorm) and the RoPE key k_pe (qk_rope_head_dim values, rotated), in that order.
//
// With kv_b_proj split per head into W_UK [qk_nope_head_dim, rank] and W_UV [v_head_dim, rank],
// k_nope = W_UK · c and v = W_UV · c, so for head h
//   q_nope · k_nope = (W_UKᵀ · q_nope) · c = q_latent · c      (W_UK folded into the query)
//   Σ_p w_p v_p     = W_UV · Σ_p w_p c_p                        (W_UV applied after the sum)
// The caller folds (q_latent) and unfolds (out_latent → v); this kernel computes, per head,
//   out_latent[h] = Σ_p softmax_p(scale · (q_latent[h] · c_p + q_rope[h] · k_pe_p)) · c_p
// over the positions p < positions (all of them: the causal limit is the caller's length).
// Accumulation is fp32; the scalar path is the reference the vectorised ones are tested against.
#pragma once

#include <cstdint>
#include <span>

namespace sluice::cpu {

struct MlaDecodeArgs {
  int heads = 0;
  int rank = 0;       // kv_lora_rank
  int rope_dim = 0;   // qk_rope_head_dim
  int positions = 0;  // cached tokens attended to, >= 1
  float scale = 0;    // the softmax scale (qk_head_dim^-0.5, with YaRN's mscale²)
  // The cache: token p's row of rank + rope_dim bf16 values is
  // blocks[p / block_size] + (p % block_size) · (rank + rope_dim).
  std::span<const uint16_t* const> blocks;
  int block_size = 0;
  const float* q_latent = nullptr;  // [heads, rank]
  const float* q_rope = nullptr;    // [heads, rope_dim]
  float* out_latent = nullptr;      // [heads, rank]
};

// The kernel of the ISA level in force (isa.h): AVX-512, AVX2 or scalar.
void mla_decode_attention(const MlaDecodeArgs& a);
// The plain loop, for tests.
void mla_decode_attention_scalar(const MlaDecodeArgs& a);

// kv_b_proj's weight [heads · (nope_dim + v_dim), rank] bf16: per head its nope_dim rows of
// W_UK, then its v_dim rows of W_UV (transformers' view(..., heads, nope_dim + v_dim) split).
struct MlaKvB {
  const uint16_t* w = nullptr;
  int heads = 0, rank = 0, nope_dim = 0, v_dim = 0;
};

// The fold: q_latent[h] = W_UK[h]ᵀ · q_nope[h] = Σ_n q_nope[h][n] · W_UK[h][n, :], for one
// query row whose head h's q_nope starts at q_nope + h · q_head_stride. q_latent [heads, rank].
void mla_fold_query(const MlaKvB& kv_b, const float* q_nope, int64_t q_head_stride,
                    float* q_latent);
void mla_fold_query_scalar(const MlaKvB& kv_b, const float* q_nope, int64_t q_head_stride,
                           float* q_latent);
// The unfold: out[h] = W_UV[h] · out_latent[h] for one query row; out [heads, v_dim].
void mla_unfold_output(const MlaKvB& kv_b, const float* out_latent, float* out);
void mla_unfold_output_scalar(const MlaKvB& kv_b, const float* out_latent, float* out);

}  // namespace sluice::cpu
