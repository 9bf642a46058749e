#include "runtime/planner/workload_sim.h"

#include <algorithm>
#include <deque>
#include <optional>

#include "core/error.h"
#include "runtime/kv_cache.h"
#include "runtime/scheduler.h"

namespace sluice {

void replay_schedule(const Policy& p, int max_positions, int window,
                     std::vector<WorkloadRequest> requests,
                     const std::function<void(const StepShape&)>& on_step) {
  if (p.batch <= 0 || p.attn_micro_batch <= 0 || p.prefill_chunk <= 0 || p.kv_blocks <= 0)
    fail(
        "workload simulation: policy {}: expected resolved batch, attn_micro_batch, "
        "prefill_chunk and kv_blocks",
        p.describe());
  // The real scheduler over a KV cache that keeps block tables but no K/V, fed tokens that never
  // stop a sequence: the steps it plans are the steps the engine would run.
  KvCacheConfig kc;
  kc.n_layers = 1;
  kc.kv_heads = 1;
  kc.head_dim = 1;
  kc.block_size = p.kv_block_size;
  kc.total_blocks = p.kv_blocks;
  kc.with_storage = false;
  PagedKvCache kv(kc);
  Scheduler sched(p, kv, max_positions);
  for (size_t i = 0; i < requests.size(); ++i) {
    Request r;
    r.id = int64_t(i);
    r.prompt.assign(size_t(std::max(0, requests[i].prompt_tokens)), 0);
    r.max_new_tokens = requests[i].new_tokens;
    r.ignore_eos = true;
    if (std::optional<Completion> failed = sched.submit(std::move(r)))
      fail("workload simulation: request {} ({} prompt + {} new tokens) can never run: {}", i,
           requests[i].prompt_tokens, requests[i].new_tokens, failed->error);
  }
  std::vector<int> sampled;
  while (!sched.done()) {
    StepPlan plan = sched.plan_step();
    if (plan.empty()) fail("workload simulation: no request can be scheduled");
    StepShape step;
    step.prefill_tokens = plan.prefill_tokens;
    step.decode_tokens = plan.decode_tokens;
    sampled.clear();
    int begin = 0;
    for (int end : plan.micro_batch_end) {
      MicroBatchShape mb;
      for (int i = begin; i < end; ++i) {
        const StepItem& it = plan.items[size_t(i)];
        const int kv_len = it.first_pos + it.count;
        const int attended = window > 0 ? std::min(window, kv_len) : kv_len;
        mb.tokens += it.count;
        mb.kv_positions += attended;
        // The engine counts (and the kernel bounds) each query row against the whole window.
        mb.qk_pairs += double(it.count) * attended;
        if (it.sample) sampled.push_back(1);
      }
      step.micro_batches.push_back(mb);
      begin = end;
    }
    step.sampled = int(sampled.size());
    on_step(step);
    sched.complete_step(plan, sampled);
  }
}

Prediction predict_workload(const CpuCostModel& model,
                            const std::vector<WorkloadRequest>& requests) {
  return predict_workload(
      model.policy(), model.config(), [&](const StepShape& s) { return model.step_seconds(s); },
      requests);
}

Prediction predict_workload(const Policy& policy, const ModelConfig& c,
                            const std::function<double(const StepShape&)>& step_seconds,
                            const std::vector<WorkloadRequest>& requests) {
  Prediction out;
  replay_schedule(policy, c.max_position_embeddings, c.sliding_window, requests,
                  [&](const StepShape& step) {
                    const double s = step_seconds(step);
                    const double T = step.prefill_tokens + step.decode_tokens;
                    out.prefill_seconds += s * step.prefill_tokens / T;
                    out.decode_seconds += s * step.decode_tokens / T;
                    out.prefill_tokens += step.prefill_tokens;
                    out.decode_tokens += step.decode_tokens;
                    out.generated_tokens += step.sampled;
                    out.total_seconds += s;
                    ++out.steps;
                  });
  return out;
}

}  // namespace sluice
