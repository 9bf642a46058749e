#include "runtime/kv_cache.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "core/large_alloc.h"
#include "kernels/cpu/convert.h"

namespace sluice {
namespace {

uint16_t* allocate_pool(const KvCacheConfig& c) {
  if (c.n_layers <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 || c.block_size <= 0 ||
      c.total_blocks < 0 || c.total_blocks > INT32_MAX)
    fail(
        "kv cache: field 'config': expected positive n_layers, kv_heads, head_dim, block_size "
        "and 0 <= total_blocks < 2^31, got {} {} {} {} {}",
        c.n_layers, c.kv_heads, c.head_dim, c.block_size, c.total_blocks);
  if (c.planes != 2 && !(c.planes == 1 && c.kv_heads == 1))
    fail("kv cache: field 'planes': expected 2 (K and V) or 1 with kv_heads 1, got {} ({} heads)",
         c.planes, c.kv_heads);
  // An empty pool is valid: with the GPU holding every sequence's attention (ω = 0) the host
  // cache has no blocks.
  if (c.total_blocks == 0) return nullptr;
  const size_t bytes = size_t(c.total_blocks) * size_t(c.block_bytes());
  const size_t rounded = (bytes + 63) / 64 * 64;
  // Not zero-filled: the OS maps pages lazily on first write, and positions are only read after
  // they are written.
  void* p = allocate_large(rounded);
  if (p == nullptr)
    fail(
        "kv cache: field 'total_blocks': could not allocate {} MiB for {} blocks; lower the "
        "KV cache budget",
        bytes >> 20, c.total_blocks);
  return static_cast<uint16_t*>(p);
}

}  // namespace

int64_t KvCacheConfig::block_bytes() const {
  return int64_t(n_layers) * planes * kv_heads * block_size * head_dim * int64_t(sizeof(uint16_t));
}

PagedKvCache::PagedKvCache(const KvCacheConfig& config)
    : config_(config), pool_(config.with_storage ? allocate_pool(config) : nullptr, &std::free) {
  free_.reserve(size_t(config.total_blocks));
  // Stack order: block 0 is handed out first.
  for (int64_t b = config.total_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));
}

void PagedKvCache::allocate(int64_t seq_id) {
  if (!seqs_.emplace(seq_id, Sequence{}).second)
    fail("kv cache: field 'seq_id': expected a new sequence, got {} which is already live", seq_id);
}

const PagedKvCache::Sequence& PagedKvCache::sequence(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end())
    fail("kv cache: field 'seq_id': expected a live sequence, got {} (not allocated)", seq_id);
  return it->second;
}

int64_t PagedKvCache::blocks_needed(int64_t seq_id, int n_tokens) const {
  const Sequence& s = sequence(seq_id);
  const int64_t bs = config_.block_size;
  const int64_t needed_total = (int64_t(s.length) + n_tokens + bs - 1) / bs;
  return std::max<int64_t>(0, needed_total - int64_t(s.blocks.size()));
}

bool PagedKvCache::append_slots(int64_t seq_id, int n_tokens) {
  if (n_tokens < 0) fail("kv cache: field 'n_tokens': expected >= 0, got {}", n_tokens);
  const int64_t needed = blocks_needed(seq_id, n_tokens);
  if (needed > free_blocks()) return false;
  Sequence& s = seqs_.find(seq_id)->second;
  for (int64_t i = 0; i < needed; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  s.length += n_tokens;
  return true;
}

void PagedKvCache::release(int64_t seq_id) {
  const Sequence& s = sequence(seq_id);
  free_.insert(free_.end(), s.blocks.rbegin(), s.blocks.rend());
  seqs_.erase(seq_id);
}

int PagedKvCache::length(int64_t seq_id) const {
  return sequence(seq_id).length;
}

std::span<const int32_t> PagedKvCache::block_table(int64_t seq_id) const {
  return sequence(seq_id).blocks;
}

double PagedKvCache::usage() const {
  return config_.total_blocks == 0 ? 0.0
                                   : 1.0 - double(free_blocks()) / double(config_.total_blocks);
}

uint16_t* PagedKvCache::layer_base(int layer) const {
  if (!pool_) fail("kv cache: this cache keeps block tables only and holds no K/V");
  if (layer < 0 || layer >= config_.n_layers)
    fail("kv cache: field 'layer': expected 0..{}, got {}", config_.n_layers - 1, layer);
  const int64_t layer_elems = config_.total_blocks * config_.planes * config_.kv_heads *
                              config_.block_size * int64_t(config_.head_dim);
  return pool_.get() + layer * layer_elems;
}

KvLayerView PagedKvCache::layer_view(int layer) const {
  if (config_.planes != 2)
    fail("kv cache: layer_view: a one-plane cache (planes 1) has no K and V tiles; use block_data");
  return {layer_base(layer), config_.block_size, config_.kv_heads, config_.head_dim};
}

void PagedKvCache::write_tokens(int layer, int64_t seq_id, int pos, int n_tokens, const float* k,
                                const float* v, int64_t row_stride) {
  const Sequence& s = sequence(seq_id);
  if (pos < 0 || n_tokens < 0 || pos + n_tokens > s.length)
    fail(
        "kv cache: field 'pos': expected positions [{}, {}) within the {} appended to sequence "
        "{}; call append_slots first",
        pos, pos + n_tokens, s.length, seq_id);
  const int d = config_.head_dim;
  if (row_stride == 0) row_stride = int64_t(config_.kv_heads) * d;
  KvLayerView view = layer_view(layer);
  uint16_t* base = layer_base(layer);
  for (int t = 0; t < n_tokens; ++t) {
    const int p = pos + t;
    const int32_t block = s.blocks[size_t(p / config_.block_size)];
    const int slot = p % config_.block_size;
    for (int h = 0; h < config_.kv_heads; ++h) {
      const int64_t k_offset = view.k_tile(block, h) - view.base + int64_t(slot) * d;
      const int64_t v_offset = view.v_tile(block, h) - view.base + int64_t(slot) * d;
      cpu::f32_to_bf16_row(k + t * row_stride + int64_t(h) * d, base + k_offset, size_t(d));
      cpu::f32_to_bf16_row(v + t * row_stride + int64_t(h) * d, base + v_offset, size_t(d));
    }
  }
  stored_bytes_ += int64_t(n_tokens) * 2 * config_.kv_heads * d * int64_t(sizeof(uint16_t));
  stored_token_layers_ += n_tokens;
}

void PagedKvCache::write_rows(int layer, int64_t seq_id, int pos, int n_tokens, const float* rows,
                              int64_t row_stride) {
  if (config_.planes != 1)
    fail("kv cache: write_rows: expected a one-plane cache (planes 1), this one has {}",
         config_.planes);
  const Sequence& s = sequence(seq_id);
  if (pos < 0 || n_tokens < 0 || pos + n_tokens > s.length)
    fail(
        "kv cache: field 'pos': expected positions [{}, {}) within the {} appended to sequence "
        "{}; call append_slots first",
        pos, pos + n_tokens, s.length, seq_id);
  const int d = config_.head_dim;
  if (row_stride == 0) row_stride = d;
  uint16_t* base = layer_base(layer);
  for (int t = 0; t < n_tokens; ++t) {
    const int p = pos + t;
    const int64_t block = s.blocks[size_t(p / config_.block_size)];
    uint16_t* dst = base + (block * config_.block_size + p % config_.block_size) * int64_t(d);
    cpu::f32_to_bf16_row(rows + t * row_stride, dst, size_t(d));
  }
  stored_bytes_ += int64_t(n_tokens) * d * int64_t(sizeof(uint16_t));
  stored_token_layers_ += n_tokens;
}

const uint16_t* PagedKvCache::block_data(int layer, int32_t block) const {
  if (block < 0 || block >= config_.total_blocks)
    fail("kv cache: field 'block': expected 0..{}, got {}", config_.total_blocks - 1, block);
  return layer_base(layer) +
         int64_t(block) * config_.planes * config_.kv_heads * config_.block_size * config_.head_dim;
}

}  // namespace sluice
