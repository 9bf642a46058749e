// The offline batch scheduler. It keeps up to B sequences active, admitting new ones from the
// queue as soon as a KV pool can hold their whole prompt and generation (so a running sequence
// never runs out of blocks and nothing is preempted); each step it prefills prompts in chunks and
// decodes every sequence past its prompt, and retires sequences at a stop token or their limit.
// The tokens of a step are split into attention micro-batches of at most b_a tokens, balanced by
// attention work (MoE-Lightning's length-balanced batching).
//
// KV pools: the host's PagedKvCache, and with an offload device whose attention takes a share
// (ω < 1) also the device's KV pool, whose block tables the scheduler keeps in a second
// PagedKvCache without storage (the K/V live in device memory; the executor reads the tables).
// A sequence is placed in one pool when it is admitted and stays there: the host pool (the CPU's
// share of attention) while that holds fewer than round(ω · n) of the n live sequences (this one
// included), else the device pool; if the pool whose turn it is lacks room for the sequence's
// whole reservation, the other pool if it has room; if neither has, admission waits. Each pool's
// reservations stay within its free blocks, so the batch the KV memory admits is what both pools
// hold together.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/request.h"
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

// Where a sequence's K/V live: the host's KV cache (attention on the CPU) or the device's KV pool.
enum class KvPool { kHost, kDevice };

// A sequence the scheduler holds: its tokens so far and how many have their KV cached.
struct ActiveSequence {
  Request request;
  std::vector<int> tokens;  // prompt, then generated tokens
  int computed = 0;         // positions whose KV is in the cache
  int generated = 0;
  KvPool pool = KvPool::kHost;  // for the sequence's whole life
  int reserved_blocks = 0;      // blocks of its pool held back for this sequence's future tokens
  Sampler sampler;
  std::vector<TokenLogprob> logprobs;  // of the generated tokens, when the request asks for them
  explicit ActiveSequence(Request r);
};

// Why `r` can never run with a context of `max_positions` and KV pools of at most `largest_pool`
// blocks of `block_size` tokens: its failed Completion (FinishReason::kError); nullopt when it can
// run once blocks free up. The rule Scheduler::submit applies, for callers that plan ahead.
std::optional<Completion> never_runs(const Request& r, int max_positions, int block_size,
                                     int64_t largest_pool);

// The device's KV pool as the scheduler sees it: block tables only (`kv`, with_storage = false),
// and the CPU's share ω of attention, which decides the placement of new sequences.
struct DeviceKvPool {
  PagedKvCache* kv = nullptr;  // null: no device pool, every sequence on the host
  double cpu_share = 1;
};

class Scheduler {
 public:
  // `kv` (and device.kv) outlive the scheduler; sequences are keyed by their slot in each.
  Scheduler(const Policy& policy, PagedKvCache& kv, int max_positions, DeviceKvPool device = {});

  // Queues `r`; or, when it can never run (never_runs), returns its failed Completion for the
  // caller to deliver, and the other requests run without it. An empty prompt or max_new_tokens
  // below 1 is the caller's bug: an error (throws).
  std::optional<Completion> submit(Request r);
  bool done() const { return queue_.empty() && active_count_ == 0; }
  size_t waiting() const { return queue_.size(); }
  int active() const { return active_count_; }

  // Drops request `id`, queued or running (its KV blocks and slot freed now); false when the
  // scheduler does not hold it. Between steps only (an online client went away).
  bool cancel(int64_t id);
  bool is_running(int64_t id) const;

  StepPlan plan_step();
  // `sampled[i]` is the token chosen for the i-th sampling item of `plan`. Returns the finished.
  std::vector<Completion> complete_step(const StepPlan& plan, const std::vector<int>& sampled);

  const ActiveSequence& sequence(int slot) const { return *slots_[slot]; }
  ActiveSequence& sequence(int slot) { return *slots_[slot]; }

  bool has_device_pool() const { return pools_[1].kv != nullptr; }
  PagedKvCache& kv(KvPool pool) const;  // fails for the device pool when there is none
  // Blocks in use over the blocks of both pools, 0..1.
  double kv_usage() const;
  // Sequences whose turn was the device pool's but which went to the host pool, the device pool
  // lacking room for them.
  int64_t device_turns_to_host() const { return device_turns_to_host_; }

 private:
  struct Pool {
    PagedKvCache* kv = nullptr;  // null: absent
    int64_t reserved = 0;        // blocks held back for the live sequences' future tokens
    int live = 0;                // sequences placed here
    bool has_room(int blocks) const { return kv && kv->free_blocks() - reserved >= blocks; }
  };
  Pool& pool(KvPool p) { return pools_[p == KvPool::kDevice]; }
  std::optional<KvPool> place(int blocks);
  void admit();
  void retire(int slot);
  int blocks_for(int tokens) const;
  void balance(StepPlan& plan) const;

  Policy policy_;
  Pool pools_[2];  // host, device
  double cpu_share_ = 1;
  int max_positions_;
  std::deque<Request> queue_;
  bool queue_sorted_ = true;                            // longest prompt first
  std::vector<std::unique_ptr<ActiveSequence>> slots_;  // size B; null when free
  int active_count_ = 0;
  int64_t device_turns_to_host_ = 0;
};

}  // namespace sluice
