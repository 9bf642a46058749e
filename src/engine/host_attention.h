// The host's share of a layer's attention, shared by the CPU engine (batch_engine.cpp) and the
// offload executor's CPU share: each sequence's new K/V into the host PagedKvCache, then paged
// attention over it (kernels/cpu/attention.h), with the CPU engine's accounting.
#pragma once

#include <cstdint>
#include <span>

#include "engine/batch_engine.h"
#include "model/config.h"
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

}  // namespace sluice
