// The host's share of a layer's attention, shared by the CPU engine (batch_engine.cpp) and the
// offload executor's CPU share: each sequence's new K/V into the host PagedKvCache, then paged
// attention over it (kernels/cpu/attention.h), with the CPU engine's accounting.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/batch_engine.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"

namespace sluice {

// One sequence's new tokens of a step: `count` rows of q ([count, q_dim]), k and v
// ([count, kv_dim], after RoPE) at positions [first_pos, first_pos + count), and where their
// attention output goes ([count, q_dim]).
struct HostAttentionItem {
  int64_t slot = 0;
  int first_pos = 0, count = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
};

// The KV bytes read and the flops of one sequence's attention, as the CPU engine counts them
// (whichever device runs it).
void account_attention(const ModelConfig& c, int first_pos, int count, EngineStats& stats);

// Writes the items' K/V into `layer` of the host cache and runs their attention there.
void host_attention(const ModelConfig& c, PagedKvCache& kv, int layer,
                    std::span<const HostAttentionItem> items, EngineStats& stats);

// Multi-head latent attention of one layer in the absorbed form, over a one-plane host cache
// (kv_pool_config) that keeps per token the normalised latent and the rotated RoPE key. Each
// item's q is [count, heads·head_dim] as q_proj (or q_b_proj) gives it, before RoPE; its k is
// kv_a_proj_with_mqa's output [count, kv_lora_rank + qk_rope_head_dim] (v unused); its out
// [count, heads·v_head_dim] is what o_proj takes. The layer's weights: kv_a_norm (fp32) and
// kv_b (bf16). `inv_freq` is rope_inv_freq(c).
void host_latent_attention(const ModelConfig& c, const LayerWeights& weights,
                           const std::vector<float>& inv_freq, PagedKvCache& kv, int layer,
                           std::span<const HostAttentionItem> items, EngineStats& stats);

}  // namespace sluice
