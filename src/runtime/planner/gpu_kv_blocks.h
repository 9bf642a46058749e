// How a policy's KV blocks split between the two pools of the GPU pipeline, for a CPU attention
// share ω: the GPU's pool holds ceil((1-ω)·kv_blocks) (the GPU share of attention), the host's
// the rest. Shared by the cost models (host and GPU memory use) and the engine, which sizes both
// pools so, and whose scheduler places each sequence in one of them.
#pragma once

#include <cstdint>

namespace sluice {

int64_t gpu_kv_blocks(int64_t kv_blocks, double cpu_attention_share);
inline int64_t host_kv_blocks(int64_t kv_blocks, double cpu_attention_share) {
  return kv_blocks - gpu_kv_blocks(kv_blocks, cpu_attention_share);
}

}  // namespace sluice
