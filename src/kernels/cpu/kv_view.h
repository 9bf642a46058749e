// The attention kernels' view of one layer of a paged bf16 KV cache. The cache itself (block
// bookkeeping, writes) is runtime/kv_cache.h; this plain view is all the kernels need, so it lives
// here and the runtime includes it.
//
// Layout of one layer: [block][K|V][kv_head][slot][head_dim], so the K (or V) of one KV head in
// one block is a contiguous [block_size, head_dim] tile.
#pragma once

#include <cstdint>

namespace sluice::cpu {

// Read-only view of one layer of the pool, as the attention kernel sees it.
struct KvLayerView {
  const uint16_t* base = nullptr;  // layer start
  int block_size = 0, kv_heads = 0, head_dim = 0;

  int64_t tile_elems() const { return int64_t(block_size) * head_dim; }  // one head in one block
  int64_t block_elems() const { return 2 * kv_heads * tile_elems(); }    // K and V, all heads
  // The [block_size, head_dim] bf16 tile of `kv_head` in pool block `block`.
  const uint16_t* k_tile(int32_t block, int kv_head) const {
    return base + block * block_elems() + kv_head * tile_elems();
  }
  const uint16_t* v_tile(int32_t block, int kv_head) const {
    return k_tile(block, kv_head) + kv_heads * tile_elems();
  }
};

}  // namespace sluice::cpu
