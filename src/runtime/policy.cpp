#include "runtime/policy.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

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
  return size_t(c.num_layers) * size_t(c.kv_cache_values_per_token()) * sizeof(uint16_t);
}

}  // namespace sluice
