#include "engine/host_attention.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/attention.h"

namespace sluice {

void account_attention(const ModelConfig& c, int first_pos, int count, EngineStats& stats) {
  const int kv_len = first_pos + count;
  const int window = c.sliding_window > 0 ? std::min(c.sliding_window, kv_len) : kv_len;
  stats.kv_bytes += double(window) * c.kv_dim() * 2 * sizeof(uint16_t);
  stats.flops += 4.0 * count * window * c.q_dim();
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

}  // namespace sluice
