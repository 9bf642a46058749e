// LLM(model, **policy): the keywords are the command line's policy, host-memory and device flags
// (batch=8 is --batch 8, host_mem="8GiB" is --host-mem 8GiB), parsed by the same code, so names,
// accepted values and error messages are the CLI's.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/engine_device.h"
#include "runtime/policy.h"

namespace sluice::python {

struct EngineSettings {
  Policy policy;
  DeviceOptions device;
  size_t host_memory_bytes = 0;  // 0: the default (engine/engine_plan.h)
};

// keywords: (name, value as text) pairs. Fails (sluice::Error) on an unknown keyword or a bad
// value, with CLI11's message.
EngineSettings parse_policy_keywords(const std::vector<std::pair<std::string, std::string>>& kw);

}  // namespace sluice::python
