// The blocks of the GPU's KV pool for a CPU attention share ω: the GPU share of the policy's KV
// blocks, ceil((1-ω)·kv_blocks). Shared by the cost model (gpu_memory_use) and the offload
// executor, so both size the same pool.
#pragma once

#include <cstdint>

namespace sluice {

int64_t gpu_kv_blocks(int64_t kv_blocks, double cpu_attention_share);

}  // namespace sluice
