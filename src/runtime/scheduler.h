// The offline batch scheduler. It keeps up to B sequences active, admitting new ones from the
// queue as soon as the KV cache can hold their whole prompt and generation (so a running sequence
// never runs out of blocks and nothing is preempted); each step it prefills prompts in chunks and
// decodes every sequence past its prompt, and retires sequences at a stop token or their limit.
// The tokens of a step are split into attention micro-batches of at most b_a tokens, balanced by
// attention work (MoE-Lightning's length-balanced batching).
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "engine/request.h"
#include "runtime/kv_cache.h"
#include "runtime/policy.h"

namespace sluice {

// Tokens [first_pos, first_pos + count) of the sequence in `slot` run in this step.
struct StepItem {
  int slot = 0;
  int first_pos = 0;
  int count = 0;
  bool sample = false;  // the last row's logits pick the sequence's next token
};

struct StepPlan {
  std::vector<StepItem> items;       // grouped by micro-batch, in order
  std::vector<int> micro_batch_end;  // micro-batch m covers items [end[m-1], end[m])
  int tokens = 0;
  int prefill_tokens = 0;
  int decode_tokens = 0;
  bool empty() const { return items.empty(); }
};

// A sequence the scheduler holds: its tokens so far and how many have their KV cached.
struct ActiveSequence {
  Request request;
  std::vector<int> tokens;  // prompt, then generated tokens
  int computed = 0;         // positions whose KV is in the cache
  int generated = 0;
  int reserved_blocks = 0;  // blocks held back for this sequence's future tokens
  Sampler sampler;
  explicit ActiveSequence(Request r);
};

class Scheduler {
 public:
  Scheduler(const Policy& policy, PagedKvCache& kv, int max_positions);

  void submit(Request r);  // fails naming the request if it can never fit
  bool done() const { return queue_.empty() && active_count_ == 0; }
  size_t waiting() const { return queue_.size(); }
  int active() const { return active_count_; }

  StepPlan plan_step();
  // `sampled[i]` is the token chosen for the i-th sampling item of `plan`. Returns the finished.
  std::vector<Completion> complete_step(const StepPlan& plan, const std::vector<int>& sampled);

  const ActiveSequence& sequence(int slot) const { return *slots_[slot]; }
  ActiveSequence& sequence(int slot) { return *slots_[slot]; }

 private:
  void admit();
  int blocks_for(int tokens) const;
  void balance(StepPlan& plan) const;

  Policy policy_;
  PagedKvCache& kv_;
  int max_positions_;
  std::deque<Request> queue_;
  bool queue_sorted_ = true;  // longest prompt first
  std::vector<std::unique_ptr<ActiveSequence>> slots_;  // size B; null when free
  int active_count_ = 0;
  int64_t reserved_total_ = 0;
};

}  // namespace sluice
