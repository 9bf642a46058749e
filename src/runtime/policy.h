// The policy: every choice the engine makes about batching and memory, as data. The scheduler
// and the executor obey it; the planner (or automatic defaults) fills it; the command line can
// override any field.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "model/config.h"

namespace sluice {

struct Policy {
  int batch = 0;              // B: sequences decoding together (0: automatic)
  int attn_micro_batch = 0;   // b_a: tokens per attention micro-batch (0: automatic)
  int expert_batch = 0;       // b_e: most tokens in one expert GEMM (0: automatic)
  int prefill_chunk = 0;      // most prompt tokens prefilled per step (0: automatic)
  int kv_block_size = 16;     // tokens per KV-cache block
  int kv_blocks = 0;          // KV-cache blocks in host memory (0: automatic)
  int threads = 0;            // 0: every core

  std::string describe() const;  // one line, for logs and reports
  nlohmann::json to_json() const;
};

// Fills every automatic (zero) field from the model shape, the workload and the memory available
// for the KV cache, until the planner chooses them.
struct WorkloadShape {
  int requests = 1;
  int max_prompt_tokens = 128;
  int max_new_tokens = 128;
};
Policy resolve_policy(Policy requested, const ModelConfig& config, const WorkloadShape& workload,
                      size_t kv_budget_bytes);

size_t kv_bytes_per_token(const ModelConfig& config);  // K and V, every layer, bf16

}  // namespace sluice
