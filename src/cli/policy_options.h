// Command-line overrides of every policy field, shared by the commands that run the engine.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/engine_device.h"
#include "engine/host_budget.h"
#include "model/config.h"
#include "runtime/policy.h"

namespace sluice::cli {

void add_policy_options(CLI::App& sub, Policy& policy);
// --expert-dtype bf16|int8|int4 and --expert-group N (part of the policy options; also on their
// own for `logits` and `quantize`).
void add_expert_dtype_options(CLI::App& sub, ExpertDtype& dtype, int& group_size,
                              const char* group = "Policy (0: automatic)");

// --host-mem: host memory the planner may fill with weights, KV cache and activations.
void add_host_memory_option(CLI::App& sub, std::string& host_mem);
// Its value as a budget (engine/host_budget.h): "" gives what this process may allocate less a
// margin; commands that allocate what they plan (`allocating`) refuse more than it may allocate.
HostBudget host_memory_budget(const std::string& host_mem, bool allocating);

// The model a planning or benchmarking command works on: --model DIR or --preset NAME, and
// --layers N (keep the first N layers).
void add_model_shape_options(CLI::App& sub, std::string& model_dir, std::string& preset,
                             int& layers);
// --prompt-len and --gen-len of a uniform synthetic workload.
void add_workload_length_options(CLI::App& sub, int& prompt_len, int& gen_len);

// Where the engine runs its steps: --device cpu|cuda|standin, --gpu-mem, and the offload
// executor's page slots and CPU-expert threshold.
void add_device_options(CLI::App& sub, DeviceOptions& device);

}  // namespace sluice::cli
