#include "runtime/policy.h"

#include "model/expert_quant.h"

#include <fmt/format.h>

#include <algorithm>

#include <nlohmann/json.hpp>

namespace sluice {

const char* precision_name(Precision p) {
  return p == Precision::kBf16 ? "bf16" : "f32";
}

int Policy::device_expert_rows() const {
  return std::max(1, std::min(batch + prefill_chunk, std::max(expert_batch, kDeviceExpertRows)));
}

std::string Policy::describe() const {
  std::string s =
      fmt::format("B={} b_a={} b_e={} prefill_chunk={} kv_blocks={}x{} threads={} precision={}",
                  batch, attn_micro_batch, expert_batch, prefill_chunk, kv_blocks, kv_block_size,
                  threads, precision_name(precision));
  if (expert_dtype != ExpertDtype::kBf16)
    s += fmt::format(" experts={}{}", expert_dtype_name(expert_dtype),
                     expert_group ? fmt::format("/g{}", expert_group) : "");
  if (pool_experts > 0) s += fmt::format(" experts on disk, pool of {}", pool_experts);
  return s;
}

nlohmann::json Policy::to_json() const {
  return {{"batch", batch},
          {"attn_micro_batch", attn_micro_batch},
          {"expert_batch", expert_batch},
          {"prefill_chunk", prefill_chunk},
          {"kv_block_size", kv_block_size},
          {"kv_blocks", kv_blocks},
          {"threads", threads},
          {"precision", precision_name(precision)},
          {"expert_dtype", std::string(expert_dtype_name(expert_dtype))},
          {"expert_group", expert_group},
          {"pool_experts", pool_experts}};
}

size_t kv_bytes_per_token(const ModelConfig& c) {
  return size_t(c.num_layers) * size_t(c.kv_cache_values_per_token()) * sizeof(uint16_t);
}

}  // namespace sluice
