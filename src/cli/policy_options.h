// Command-line overrides of every policy field, shared by the commands that run the engine.
#pragma once

#include <CLI/CLI.hpp>

#include "engine/engine_device.h"
#include "runtime/policy.h"

namespace sluice::cli {

void add_policy_options(CLI::App& sub, Policy& policy);

// Where the engine runs its steps: --device cpu|cuda|standin, --gpu-mem, and the offload
// executor's page slots and CPU-expert threshold.
void add_device_options(CLI::App& sub, DeviceOptions& device);

}  // namespace sluice::cli
