#include "runtime/policy.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sluice {

const char* precision_name(Precision p) {
  return p == Precision::kBf16 ? "bf16" : "f32";
}

std::string Policy::describe() const {
  return fmt::format("B={} b_a={} b_e={} prefill_chunk={} kv_blocks={}x{} threads={} precision={}",
                     batch, attn_micro_batch, expert_batch, prefill_chunk, kv_blocks, kv_block_size,
                     threads, precision_name(precision));
}

nlohmann::json Policy::to_json() const {
  return {{"batch", batch},
          {"attn_micro_batch", attn_micro_batch},
          {"expert_batch", expert_batch},
          {"prefill_chunk", prefill_chunk},
          {"kv_block_size", kv_block_size},
          {"kv_blocks", kv_blocks},
          {"threads", threads},
          {"precision", precision_name(precision)}};
}

size_t kv_bytes_per_token(const ModelConfig& c) {
  return size_t(2) * c.num_layers * c.kv_dim() * sizeof(uint16_t);
}

Policy resolve_policy(Policy p, const ModelConfig& c, const WorkloadShape& w, size_t kv_budget) {
  if (p.kv_block_size <= 0) fail("policy: kv_block_size must be positive, got {}", p.kv_block_size);
  const int per_sequence = w.max_prompt_tokens + w.max_new_tokens;
  const int blocks_per_sequence = (per_sequence + p.kv_block_size - 1) / p.kv_block_size;
  const size_t block_bytes = kv_bytes_per_token(c) * p.kv_block_size;
  if (p.threads <= 0) p.threads = omp_get_num_procs();
  if (p.batch <= 0) {
    // Experts want many tokens per weight read: a decode step over B sequences gives each expert
    // about B·k/E tokens. 256 sequences bring Mixtral's experts to 64 tokens each, past the
    // point where a bf16 GEMM stops being bound by weight bandwidth on a CPU.
    p.batch = std::min(256, std::max(1, w.requests));
  }
  if (p.kv_blocks <= 0) {
    size_t affordable = kv_budget / block_bytes;
    size_t wanted = size_t(p.batch) * blocks_per_sequence;
    p.kv_blocks = int(std::max<size_t>(blocks_per_sequence, std::min(affordable, wanted)));
  }
  if (p.kv_blocks < blocks_per_sequence)
    fail("policy: {} KV blocks of {} tokens cannot hold one sequence of {} tokens (needs {})",
         p.kv_blocks, p.kv_block_size, per_sequence, blocks_per_sequence);
  p.batch = std::min(p.batch, p.kv_blocks / blocks_per_sequence);
  if (p.prefill_chunk <= 0) p.prefill_chunk = 512;
  if (p.attn_micro_batch <= 0) p.attn_micro_batch = 256;
  if (p.expert_batch <= 0) p.expert_batch = 1024;
  return p;
}

}  // namespace sluice
