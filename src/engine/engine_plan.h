// How the commands that run the engine choose its policy: the planner (runtime/planner) over the
// actual requests, with the hardware profile of this machine.
#pragma once

#include <string>
#include <vector>

#include "engine/request.h"
#include "model/config.h"
#include "runtime/planner/hardware_profile.h"
#include "runtime/planner/workload_sim.h"
#include "runtime/policy.h"

namespace sluice {

// The profile the planner uses, for `threads` OpenMP threads (0: all cores): the cached `sluice
// profile` of this machine when there is one; else the two quick ceilings (DRAM bandwidth and
// bf16 GEMM peak), measured once per machine and thread count and cached beside it, so that
// every later run plans with the same numbers (and so picks the same policy for the same input).
HardwareProfile planner_profile(int threads);

// Host memory the planner may fill when the user gives no --host-mem: the weights, plus half of
// what the system has available now for the KV cache and activations.
size_t default_host_memory(const ModelConfig& c);

struct EnginePlan {
  Policy policy;  // every field resolved
  Prediction prediction;
  std::string profile_source;    // "quick" or the cached profile's path
  std::string describe() const;  // "B=… (planned for N requests: predicted … tokens/s …)"
};

// The planner's policy for exactly these requests (their prompt lengths and generation limits),
// within `host_memory_bytes` for weights, KV cache and activations; the non-zero fields of
// `requested` are kept. Fails, saying what would fit, when nothing does.
EnginePlan plan_for_requests(const ModelConfig& c, const Policy& requested,
                             const std::vector<Request>& requests, size_t host_memory_bytes);

}  // namespace sluice
