#include "runtime/planner/workload_sim.h"

#include <algorithm>
#include <deque>
#include <optional>

#include "core/error.h"

namespace sluice {
namespace {

struct SimSequence {
  WorkloadRequest request;
  int computed = 0, generated = 0, need_blocks = 0;
};

struct Item {
  int slot, first_pos, count;
  bool sample, prefill;
};

}  // namespace

void replay_schedule(const Policy& p, int max_positions, int window,
                     std::vector<WorkloadRequest> requests,
                     const std::function<void(const StepShape&)>& on_step) {
  if (p.batch <= 0 || p.attn_micro_batch <= 0 || p.prefill_chunk <= 0 || p.kv_blocks <= 0)
    fail(
        "workload simulation: policy {}: expected resolved batch, attn_micro_batch, "
        "prefill_chunk and kv_blocks",
        p.describe());
  auto blocks_for = [&](int tokens) { return (tokens + p.kv_block_size - 1) / p.kv_block_size; };
  std::deque<WorkloadRequest> queue(requests.begin(), requests.end());
  for (const WorkloadRequest& r : queue) {
    const int total = std::min(r.prompt_tokens + r.new_tokens, max_positions);
    if (r.prompt_tokens < 1 || r.new_tokens < 1 || blocks_for(total) > p.kv_blocks)
      fail("workload simulation: a request of {} + {} tokens cannot run with {} KV blocks of {}",
           r.prompt_tokens, r.new_tokens, p.kv_blocks, p.kv_block_size);
  }
  // The scheduler sorts the queue by prompt length, longest first, stably, at each admission;
  // with no new submissions one sort up front gives the same order.
  std::stable_sort(queue.begin(), queue.end(),
                   [](const WorkloadRequest& a, const WorkloadRequest& b) {
                     return a.prompt_tokens > b.prompt_tokens;
                   });
  std::vector<std::optional<SimSequence>> slots(size_t(p.batch));
  int active = 0;
  int64_t claimed_blocks = 0;  // Σ whole-sequence reservations of active sequences
  while (!queue.empty() || active > 0) {
    // admit(): lowest free slot first; stop at the first request that does not fit.
    for (size_t s = 0; s < slots.size() && !queue.empty(); ++s) {
      if (slots[s]) continue;
      const WorkloadRequest& next = queue.front();
      const int need = blocks_for(std::min(next.prompt_tokens + next.new_tokens, max_positions));
      if (p.kv_blocks - claimed_blocks < need) break;
      slots[s] = SimSequence{next, 0, 0, need};
      claimed_blocks += need;
      ++active;
      queue.pop_front();
    }
    // plan_step()
    std::vector<Item> items;
    int budget = p.prefill_chunk, tokens = 0;
    for (size_t s = 0; s < slots.size(); ++s) {
      if (!slots[s]) continue;
      const SimSequence& q = *slots[s];
      Item it{int(s), q.computed, 0, false, false};
      if (q.computed < q.request.prompt_tokens) {
        it.count = std::min({q.request.prompt_tokens - q.computed, budget, p.attn_micro_batch});
        if (it.count == 0) continue;
        budget -= it.count;
        it.sample = q.computed + it.count == q.request.prompt_tokens;
        it.prefill = true;
      } else {
        it.count = 1;
        it.sample = true;
      }
      items.push_back(it);
      tokens += it.count;
    }
    if (items.empty()) fail("workload simulation: no request can be scheduled");
    // balance(): longest-processing-time-first packing into micro-batches of <= b_a tokens.
    const int cap = p.attn_micro_batch;
    auto work = [](const Item& it) {
      return int64_t(it.count) * (it.first_pos + (it.count + 1) / 2) + it.count;
    };
    std::vector<Item> sorted = items;
    std::stable_sort(sorted.begin(), sorted.end(),
                     [&](const Item& a, const Item& b) { return work(a) > work(b); });
    const int groups = std::max(1, (tokens + cap - 1) / cap);
    std::vector<MicroBatchShape> mbs(static_cast<size_t>(groups));
    std::vector<int64_t> load(static_cast<size_t>(groups), 0);
    int sampled = 0;
    StepShape step;
    for (const Item& it : sorted) {
      int best = -1;
      for (int g = 0; g < int(mbs.size()); ++g)
        if (mbs[size_t(g)].tokens + it.count <= cap &&
            (best < 0 || load[size_t(g)] < load[size_t(best)]))
          best = g;
      if (best < 0) {
        mbs.emplace_back();
        load.push_back(0);
        best = int(mbs.size()) - 1;
      }
      MicroBatchShape& mb = mbs[size_t(best)];
      const int kv_len = it.first_pos + it.count;
      mb.tokens += it.count;
      mb.kv_positions += window > 0 ? std::min(window, kv_len) : kv_len;
      // The engine counts (and the kernel bounds) each query row against the whole window.
      mb.qk_pairs += double(it.count) * (window > 0 ? std::min(window, kv_len) : kv_len);
      load[size_t(best)] += work(it);
      sampled += it.sample ? 1 : 0;
      (it.prefill ? step.prefill_tokens : step.decode_tokens) += it.count;
    }
    for (const MicroBatchShape& mb : mbs)
      if (mb.tokens > 0) step.micro_batches.push_back(mb);
    step.sampled = sampled;
    on_step(step);
    // complete_step()
    for (const Item& it : items) {
      SimSequence& q = *slots[size_t(it.slot)];
      q.computed += it.count;
      if (!it.sample) continue;
      ++q.generated;
      const int length = q.request.prompt_tokens + q.generated;
      if (q.generated >= q.request.new_tokens || length >= max_positions) {
        claimed_blocks -= q.need_blocks;
        slots[size_t(it.slot)].reset();
        --active;
      }
    }
  }
}

Prediction predict_workload(const CpuCostModel& model,
                            const std::vector<WorkloadRequest>& requests) {
  Prediction out;
  const ModelConfig& c = model.config();
  replay_schedule(model.policy(), c.max_position_embeddings, c.sliding_window, requests,
                  [&](const StepShape& step) {
                    const double s = model.step_seconds(step);
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
