// The host-memory budget of the commands that load a model, and the one check, before loading,
// that the model can be served within it. The default budget is what this process may really
// allocate (runtime/memory_info.h: MemAvailable, cgroup limits, `ulimit -v`) less a margin; it
// never depends on the model.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "model/config.h"

namespace sluice {

struct HostBudget {
  size_t bytes = 0;
  std::string source;  // how it was chosen, for messages: "--host-mem", "what this process ..."
};

// What the process may allocate now, less a margin (5%, at least 256 MiB) for what the plan
// does not count (the tokenizer, the libraries' buffers, the results being written).
HostBudget default_host_budget();

// `requested` bytes from --host-mem (0: the default). A command that allocates what it plans
// (`allocating`) refuses a request larger than what the process may allocate, since the kernel
// would kill it part way; `plan` may plan for any amount.
HostBudget host_budget(size_t requested, bool allocating);

// Why the disk tier (the routed experts left in their files, runtime/disk/expert_page_pool.h)
// cannot serve the model at `dir`: a GGUF file whose experts are F32 or F16; "" when it can
// (bf16, quantized and FP8 safetensors folders; GGUF files in BF16 or block types).
std::string disk_tier_refusal(const std::filesystem::path& dir);

// Fails, with the numbers and the ways out (a larger --host-mem where the machine has it, the
// disk tier, quantized experts through `sluice quantize`), when a model with config `c` (experts
// as they will be held) cannot be served within `budget`: its weights do not fit and either the
// disk tier cannot take it (`no_disk_tier` says why, as disk_tier_refusal) or even the weights
// but the routed experts and the smallest page pool do not fit. The KV cache and activations are
// the planner's to check. `what` names the model.
void require_servable(const ModelConfig& c, const HostBudget& budget, std::string_view what,
                      std::string_view no_disk_tier);

}  // namespace sluice
