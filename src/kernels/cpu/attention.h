// Attention of new query tokens against a sequence's paged bf16 KV cache (flash-decode style).
//
// For each query token i at position q_pos = q_start + i and each query head h (KV head
// h / (heads / kv_heads), grouped-query attention):
//   out[i, h] = Σ_p softmax_p(scale · q[i, h] · K[p, kv]) · V[p, kv]
// over the key positions p < kv_len allowed by the causal mask (p <= q_pos) and, if
// sliding_window > 0, by the window (q_pos - sliding_window < p), the transformers semantics.
// Queries that see no key (impossible when q_pos < kv_len) get zeros.
//
// The fast path walks the sequence's KV blocks once per (sequence, KV head, chunk of queries)
// with an online softmax (running max, running sum, rescaled fp32 accumulator), so each K/V tile
// is read from memory once for all the query heads of its group; tasks run in parallel with
// OpenMP. K and V are the caller's responsibility to have written (the runtime's
// PagedKvCache::write_tokens), including the new tokens' own K/V before their attention.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/kv_view.h"

namespace sluice::cpu {

struct AttentionParams {
  int heads = 0, kv_heads = 0, head_dim = 0;
  int sliding_window = 0;  // 0: unlimited
  float scale = 0.0f;      // 0: 1/sqrt(head_dim)
};

struct AttentionSequence {
  const float* q = nullptr;  // [n_q, heads, head_dim] fp32, token rows q_stride floats apart
  float* out = nullptr;      // [n_q, heads, head_dim] fp32, token rows out_stride floats apart
  int n_q = 1;               // 1 for decode, the chunk length for prefill
  int q_start = 0;           // position of query 0
  int kv_len = 0;            // positions [0, kv_len) are in the cache; q_start + n_q <= kv_len
  std::span<const int32_t> block_table;  // from PagedKvCache::block_table
  int64_t q_stride = 0, out_stride = 0;  // 0: heads·head_dim
};

// Attention for a batch of sequences against one layer of the KV cache.
void paged_attention(const AttentionParams& params, const KvLayerView& kv,
                     std::span<const AttentionSequence> seqs);

// Plain reference: full softmax in double precision over dense fp32 K and V laid out
// [kv_len, kv_heads, head_dim]; q and out are [n_q, heads, head_dim] dense. For tests.
void attention_reference(const AttentionParams& params, const float* q, int n_q, int q_start,
                         const float* k, const float* v, int kv_len, float* out);

}  // namespace sluice::cpu
