// Replays the scheduler (runtime/scheduler.cpp) on a workload without running the model: the
// real Scheduler plans every step over a KV cache that keeps block tables only, so admission,
// chunked prefill, decode and the packing into attention micro-batches are the engine's own. Each
// step's shape goes to the cost model; the predicted time is split between prefill and decode by
// the step's token mix exactly as BatchEngine::run splits measured time, so predictions compare
// one to one with `sluice bench`.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/planner/cost_model.h"
#include "runtime/policy.h"

namespace sluice {

struct WorkloadRequest {
  int prompt_tokens = 0;
  int new_tokens = 0;  // generated until this limit (EOS is not predicted)
};

struct Prediction {
  int64_t steps = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  int64_t generated_tokens = 0;  // sampled tokens: decode tokens plus each prompt's first token
  double prefill_seconds = 0, decode_seconds = 0, total_seconds = 0;
  double prefill_tokens_per_s() const {
    return prefill_seconds > 0 ? prefill_tokens / prefill_seconds : 0;
  }
  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? decode_tokens / decode_seconds : 0;
  }
  double total_tokens_per_s() const {
    // As `sluice bench` counts end to end: prompt plus generated tokens over the whole run.
    return total_seconds > 0 ? double(prefill_tokens + generated_tokens) / total_seconds : 0;
  }
};

// Calls `on_step` with the shape of every step the scheduler would run (policy fields resolved).
void replay_schedule(const Policy& policy, int max_positions, int sliding_window,
                     std::vector<WorkloadRequest> requests,
                     const std::function<void(const StepShape&)>& on_step);

Prediction predict_workload(const CpuCostModel& model,
                            const std::vector<WorkloadRequest>& requests);
// The same with any step-time model (the GPU offload pipeline's, for one).
Prediction predict_workload(const Policy& policy, const ModelConfig& config,
                            const std::function<double(const StepShape&)>& step_seconds,
                            const std::vector<WorkloadRequest>& requests);

}  // namespace sluice
