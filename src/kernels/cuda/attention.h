// Attention over the GPU's share of the paged KV cache (kernels/cpu/attention.h on the GPU).
// The GPU pool has the host pool's layout for one layer, [block][K|V][kv_head][slot][head_dim]
// bf16, so blocks can move between them with plain copies.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sluice::cuda {

struct PagedAttentionArgs {
  int heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  int sliding_window = 0;              // 0: unlimited
  float scale = 0.0f;                  // 0: 1/sqrt(head_dim)
  const uint16_t* kv = nullptr;        // one layer of the GPU pool
  int64_t rows = 0;                    // query rows
  const float* q = nullptr;            // [rows, heads, head_dim]
  float* out = nullptr;                // [rows, heads, head_dim]
  const int32_t* row_pos = nullptr;    // [rows] query position; keys 0..row_pos are visible
  const int32_t* row_table = nullptr;  // [rows] offset of the row's block table in `tables`
  const int32_t* tables = nullptr;     // concatenated block tables
};

void paged_attention(const PagedAttentionArgs& args, cudaStream_t stream);

// Stores K and V rows into one layer of the GPU pool, rounded to bf16 (round to nearest even, as
// PagedKvCache::write_tokens): pool slot slots[j] (block · block_size + offset) takes row rows[j]
// of k and v, each [*, kv_heads · head_dim] fp32.
void write_kv(uint16_t* kv, int kv_heads, int head_dim, int block_size, const float* k,
              const float* v, const int32_t* rows, const int32_t* slots, int64_t n,
              cudaStream_t stream);

}  // namespace sluice::cuda
