// Policy search: the engine's policy that maximises predicted end-to-end throughput of a
// workload on this machine, under its memory limits, with the reasons in words.
//
// Searched: B (powers of two up to 1024, and the request count), b_a, b_e and the prefill chunk,
// by coordinate descent over powers of two from the old fixed defaults until no single change
// helps; KV blocks follow from B (every admitted sequence reserves its whole length). Fields the
// caller sets (non-zero) are kept. With a GPU memory limit (and a GPU in the profile) the search
// also covers the offload plan of the GPU pipeline (offload_cost_model.h): the CPU share of
// attention ω, how many layers' experts stay resident on the GPU, the page size, the prefetch
// depth and the most tokens an expert may have to run on the CPU; GPU memory (resident weights,
// the GPU's KV share, page slots, step buffers) must fit the limit, host memory the weights, the
// CPU's KV share and the activations. Without one, every weight is resident in host memory and
// attention is all on the CPU.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "runtime/planner/cost_model.h"
#include "runtime/planner/hardware_profile.h"
#include "runtime/planner/offload_cost_model.h"
#include "runtime/planner/workload_sim.h"
#include "runtime/policy.h"

namespace sluice {

struct MemoryLimits {
  size_t host_bytes = 0;  // weights + KV cache + activations must fit
  size_t gpu_bytes = 0;   // 0: no GPU
  // The routed experts stay on disk (the disk tier): host memory holds the other weights and a
  // page pool of experts, which gets what the KV cache and activations leave (policy
  // pool_experts, unless the caller fixed it).
  bool experts_on_disk = false;
};

// Whether the experts must stay on disk: the weights alone are larger than `host_bytes`.
bool experts_stay_on_disk(const ModelConfig& c, size_t host_bytes);

// Offload-plan fields the executor fixes (what it can run, or what the user set); the unset ones
// are searched.
struct OffloadConstraints {
  std::optional<double> cpu_attention_share;  // ω as given (the search tries quarters)
  std::optional<int> resident_expert_layers;
  bool expert_matrix_pages = false;  // pages of one expert weight matrix only
  std::optional<int> prefetch_depth;
  std::optional<int> cpu_expert_max_tokens;
  std::optional<int> cache_pages;  // the device's expert cache; unset: what the budget leaves
};

struct HostMemoryUse {
  size_t weights = 0, kv_cache = 0, activations = 0;
  size_t total() const { return weights + kv_cache + activations; }
};
size_t model_weight_bytes(const ModelConfig& c);  // as the engine holds them (bf16 or packed)
size_t routed_expert_bytes(const ModelConfig& c);  // of those, the routed experts'
// With policy pool_experts > 0 (the disk tier) the weights are those but the routed experts,
// and the pool's slots.
HostMemoryUse host_memory_use(const ModelConfig& c, const Policy& p);
// With the GPU pipeline the host holds only the CPU share's KV blocks (host_kv_blocks).
HostMemoryUse host_memory_use(const ModelConfig& c, const Policy& p, const OffloadPlan& o);

// Why a phase takes the time it does, from a representative step's task graph.
struct PhaseBottleneck {
  std::string phase;                   // "decode", "prefill"
  std::string group;                   // task group with the most time
  Resource resource = Resource::kCpu;  // where that group runs
  Bound bound = Bound::kMemory;
  double fraction = 0;  // of the step's critical path
  double step_seconds = 0;
  StepShape step;
  ResourceUse use;               // busy fractions and link traffic of the step (GPU pipeline)
  std::string sentence() const;  // "decode is bound by GEMM compute in the expert GEMMs: 81% ..."
};

struct PlannedPolicy {
  Policy policy;
  OffloadPlan offload;
  Prediction prediction;
  HostMemoryUse memory;
  GpuMemoryUse gpu_memory;  // zero for the CPU engine
};

struct Plan {
  PlannedPolicy chosen;
  std::vector<PlannedPolicy> runners_up;  // next best distinct policies, best first
  OffloadPlan offload;                    // chosen.offload
  std::vector<PhaseBottleneck> bottlenecks;
  int evaluated = 0;
};

// Representative steps of the chosen policy (the largest prefill step, the largest pure decode
// step) and their bottlenecks.
std::vector<PhaseBottleneck> explain(const CpuCostModel& model,
                                     const std::vector<WorkloadRequest>& work);
std::vector<PhaseBottleneck> explain(const OffloadCostModel& model,
                                     const std::vector<WorkloadRequest>& work);

// Fills the zero fields of `requested`; fails, saying what would fit, when no policy fits.
// limits.gpu_bytes > 0 plans for the GPU pipeline and needs hw.gpu.
Plan plan_policy(const HardwareProfile& hw, const ModelConfig& c, const Policy& requested,
                 const std::vector<WorkloadRequest>& workload, const MemoryLimits& limits,
                 const OffloadConstraints& fixed = {});

// Prediction for a policy as given (every field resolved).
Prediction predict(const HardwareProfile& hw, const ModelConfig& c, const Policy& policy,
                   const std::vector<WorkloadRequest>& workload);
// With the GPU pipeline's model when offload.gpu is set.
Prediction predict(const HardwareProfile& hw, const ModelConfig& c, const Policy& policy,
                   const OffloadPlan& offload, const std::vector<WorkloadRequest>& workload);

std::vector<WorkloadRequest> uniform_workload(int requests, int prompt_tokens, int new_tokens);

}  // namespace sluice
