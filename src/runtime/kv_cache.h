// Paged KV cache in host memory (vLLM-style PagedAttention layout).
//
// The pool holds `total_blocks` blocks, fixed at construction: the planner decides how much host
// memory the KV cache gets, and the scheduler admits sequences only while blocks are free. A block
// holds `block_size` consecutive token positions of one sequence, for every layer. A sequence owns
// a block table: position p lives in block table[p / block_size], slot p % block_size.
//
// Memory layout, chosen for the attention kernel (bf16):
//   pool[layer][block][K|V][kv_head][slot][head_dim]
// so the K (or V) of one KV head in one block is a contiguous [block_size, head_dim] tile that the
// kernel reads once for every query head of its GQA group, and one layer's blocks are contiguous.
// A one-plane cache (planes = 1: multi-head latent attention) keeps one row per token instead,
//   pool[layer][block][slot][head_dim]
// head_dim being the row's width (MLA: the latent and the RoPE key, kv_heads 1).
//
// Bookkeeping (allocate/append/release) is not thread-safe: the scheduler calls it from one
// thread. write_tokens() for different sequences, and reads through views, may run concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/kv_view.h"

namespace sluice {

struct KvCacheConfig {
  int n_layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;  // tokens per block
  int planes = 2;       // 2: K and V; 1: one row of head_dim values per token (kv_heads 1)
  int64_t total_blocks = 0;
  bool with_storage = true;  // false: block bookkeeping only, no memory (the planner's replay)

  // Bytes of one block across all layers (K and V): the unit the planner budgets in.
  int64_t block_bytes() const;
};

// The attention kernels' view of one layer (kernels/cpu/kv_view.h).
using cpu::KvLayerView;

class PagedKvCache {
 public:
  explicit PagedKvCache(const KvCacheConfig& config);
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  const KvCacheConfig& config() const { return config_; }

  // Registers an empty sequence. Fails if seq_id is already live.
  void allocate(int64_t seq_id);
  // Blocks the sequence would need to grow by n_tokens (0 if its last block has room).
  int64_t blocks_needed(int64_t seq_id, int n_tokens) const;
  // Grows the sequence by n_tokens positions, taking blocks from the free list. If there are not
  // enough free blocks it changes nothing and returns false: the scheduler defers the sequence.
  bool append_slots(int64_t seq_id, int n_tokens);
  // Returns the sequence's blocks to the free list and forgets it.
  void release(int64_t seq_id);

  bool contains(int64_t seq_id) const { return seqs_.count(seq_id) != 0; }
  int length(int64_t seq_id) const;  // positions appended so far
  std::span<const int32_t> block_table(int64_t seq_id) const;
  int64_t free_blocks() const { return int64_t(free_.size()); }
  int64_t total_blocks() const { return config_.total_blocks; }
  double usage() const;  // fraction of blocks in use, 0..1
  size_t live_sequences() const { return seqs_.size(); }

  // Stores K and V (fp32, rounded to bf16) of n_tokens consecutive positions starting at `pos`
  // of one layer. Row t of k and v holds kv_heads·head_dim values (head-major, the layout of
  // k_proj's output after RoPE); rows are `row_stride` floats apart (0: kv_heads·head_dim).
  // The positions must already be appended.
  void write_tokens(int layer, int64_t seq_id, int pos, int n_tokens, const float* k,
                    const float* v, int64_t row_stride = 0);

  KvLayerView layer_view(int layer) const;

  // A one-plane cache: stores n_tokens rows of head_dim values (fp32, rounded to bf16) at
  // positions [pos, pos + n_tokens), rows `row_stride` floats apart (0: head_dim).
  void write_rows(int layer, int64_t seq_id, int pos, int n_tokens, const float* rows,
                  int64_t row_stride = 0);
  // The first row of pool block `block` in `layer` ([block_size, head_dim] bf16 per plane).
  const uint16_t* block_data(int layer, int32_t block) const;

  // What the writes stored so far: bf16 bytes, and the (token, layer) pairs they were for.
  int64_t stored_bytes() const { return stored_bytes_; }
  int64_t stored_token_layers() const { return stored_token_layers_; }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int length = 0;
  };
  const Sequence& sequence(int64_t seq_id) const;
  uint16_t* layer_base(int layer) const;

  KvCacheConfig config_;
  std::unique_ptr<uint16_t, void (*)(void*)> pool_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::unordered_map<int64_t, Sequence> seqs_;
  std::atomic<int64_t> stored_bytes_ = 0;  // writes of different sequences may run concurrently
  std::atomic<int64_t> stored_token_layers_ = 0;
};

}  // namespace sluice
