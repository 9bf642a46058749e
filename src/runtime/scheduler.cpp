#include "runtime/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace sluice {

ActiveSequence::ActiveSequence(Request r)
    : request(std::move(r)), tokens(request.prompt), sampler(request.sampling) {}

Scheduler::Scheduler(const Policy& policy, PagedKvCache& kv, int max_positions, DeviceKvPool device)
    : policy_(policy),
      cpu_share_(device.cpu_share),
      max_positions_(max_positions),
      slots_(policy.batch) {
  if (policy.batch <= 0 || policy.attn_micro_batch <= 0 || policy.prefill_chunk <= 0)
    fail(
        "scheduler: policy fields batch, attn_micro_batch and prefill_chunk must be resolved "
        "(got {})",
        policy.describe());
  pools_[0].kv = &kv;
  if (device.kv) {
    if (device.kv->config().block_size != kv.config().block_size)
      fail(
          "scheduler: field 'device.kv.block_size': expected the host cache's block size {}, "
          "got {}",
          kv.config().block_size, device.kv->config().block_size);
    if (!(device.cpu_share >= 0 && device.cpu_share <= 1))
      fail("scheduler: field 'device.cpu_share': expected in [0, 1], got {}", device.cpu_share);
    pools_[1].kv = device.kv;
  }
}

PagedKvCache& Scheduler::kv(KvPool p) const {
  PagedKvCache* cache = pools_[p == KvPool::kDevice].kv;
  if (!cache)
    fail("scheduler: field 'pool': expected the host pool, this scheduler has no device pool");
  return *cache;
}

double Scheduler::kv_usage() const {
  int64_t used = 0, total = 0;
  for (const Pool& p : pools_) {
    if (!p.kv) continue;
    used += p.kv->total_blocks() - p.kv->free_blocks();
    total += p.kv->total_blocks();
  }
  return total > 0 ? double(used) / double(total) : 0.0;
}

int Scheduler::blocks_for(int tokens) const {
  const int bs = pools_[0].kv->config().block_size;
  return (tokens + bs - 1) / bs;
}

std::optional<Completion> never_runs(const Request& r, int max_positions, int block_size,
                                     int64_t largest_pool) {
  Completion c;
  c.id = r.id;
  c.prompt_tokens = int(r.prompt.size());
  c.reason = FinishReason::kError;
  if (int(r.prompt.size()) >= max_positions) {
    c.failure = RequestFailure::kPromptTooLong;
    c.error = fmt::format(
        "the prompt has {} tokens; the model's context holds {}, so none are left to generate",
        r.prompt.size(), max_positions);
    return c;
  }
  // A sequence stops at the end of the context: it never needs more blocks than that.
  const int tokens = std::min(int(r.prompt.size()) + r.max_new_tokens, max_positions);
  const int64_t needed = (int64_t(tokens) + block_size - 1) / block_size;
  if (needed <= largest_pool) return std::nullopt;
  c.failure = RequestFailure::kKvCacheTooSmall;
  c.error = fmt::format(
      "{} prompt + {} new tokens need {} KV-cache blocks of {} tokens; the largest KV pool has {}",
      r.prompt.size(), r.max_new_tokens, needed, block_size, largest_pool);
  return c;
}

std::optional<Completion> Scheduler::submit(Request r) {
  if (r.prompt.empty()) fail("request {}: the prompt is empty", r.id);
  if (r.max_new_tokens < 1) fail("request {}: max_new_tokens must be at least 1", r.id);
  int64_t largest = 0;
  for (const Pool& p : pools_)
    if (p.kv) largest = std::max(largest, p.kv->total_blocks());
  if (std::optional<Completion> failed =
          never_runs(r, max_positions_, pools_[0].kv->config().block_size, largest))
    return failed;
  queue_.push_back(std::move(r));
  queue_sorted_ = false;
  return std::nullopt;
}

// The pool a new sequence of `blocks` goes to, if any has room: the host's while it holds fewer
// than round(ω · n) of the n live sequences (this one included), else the device's; the other
// one when the chosen one lacks room.
std::optional<KvPool> Scheduler::place(int blocks) {
  if (!has_device_pool())
    return pools_[0].has_room(blocks) ? std::optional(KvPool::kHost) : std::nullopt;
  const bool host_turn = pools_[0].live < std::llround(cpu_share_ * double(active_count_ + 1));
  const KvPool turn = host_turn ? KvPool::kHost : KvPool::kDevice;
  const KvPool other = host_turn ? KvPool::kDevice : KvPool::kHost;
  if (pool(turn).has_room(blocks)) return turn;
  if (!pool(other).has_room(blocks)) return std::nullopt;
  device_turns_to_host_ += !host_turn;
  return other;
}

// Admits queued requests, longest prompt first, while a slot is free and a KV pool can hold the
// whole sequence on top of what its running sequences have reserved.
void Scheduler::admit() {
  if (queue_.empty() || active_count_ == int(slots_.size())) return;
  if (!queue_sorted_) {  // sorted once after submissions, not at every step
    std::stable_sort(queue_.begin(), queue_.end(), [](const Request& a, const Request& b) {
      return a.prompt.size() > b.prompt.size();
    });
    queue_sorted_ = true;
  }
  for (size_t slot = 0; slot < slots_.size() && !queue_.empty(); ++slot) {
    if (slots_[slot]) continue;
    const Request& next = queue_.front();
    const int total = std::min(int(next.prompt.size()) + next.max_new_tokens, max_positions_);
    const int need = blocks_for(total);
    const std::optional<KvPool> where = place(need);
    if (!where) return;  // defer until blocks free up
    auto seq = std::make_unique<ActiveSequence>(std::move(queue_.front()));
    queue_.pop_front();
    Pool& p = pool(*where);
    seq->pool = *where;
    seq->reserved_blocks = need;
    p.reserved += need;
    ++p.live;
    p.kv->allocate(int64_t(slot));
    slots_[slot] = std::move(seq);
    ++active_count_;
  }
}

StepPlan Scheduler::plan_step() {
  admit();
  StepPlan plan;
  int prefill_budget = policy_.prefill_chunk;
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    ActiveSequence* s = slots_[slot].get();
    if (!s) continue;
    const int prompt = int(s->request.prompt.size());
    StepItem item{int(slot), s->computed, 0, false};
    if (s->computed < prompt) {
      item.count = std::min({prompt - s->computed, prefill_budget, policy_.attn_micro_batch});
      if (item.count == 0) continue;  // this step's prefill budget is spent
      prefill_budget -= item.count;
      item.sample = s->computed + item.count == prompt;
      plan.prefill_tokens += item.count;
    } else {
      item.count = 1;  // the last generated token
      item.sample = true;
      plan.decode_tokens += 1;
    }
    plan.items.push_back(item);
    plan.tokens += item.count;
  }
  balance(plan);
  // Blocks for this step's positions come out of the sequence's reservation.
  for (const StepItem& item : plan.items) {
    ActiveSequence& s = *slots_[item.slot];
    Pool& p = pool(s.pool);
    const int64_t before = p.kv->free_blocks();
    if (!p.kv->append_slots(item.slot, item.count))
      fail("scheduler: KV cache refused {} positions reserved for request {}", item.count,
           s.request.id);
    const int taken = int(before - p.kv->free_blocks());
    s.reserved_blocks -= taken;
    p.reserved -= taken;
  }
  return plan;
}

// Longest-processing-time-first packing: items sorted by attention work (KV positions read by
// their queries) go to the least loaded micro-batch with room for their tokens.
void Scheduler::balance(StepPlan& plan) const {
  const int cap = policy_.attn_micro_batch;
  const int groups = std::max(1, (plan.tokens + cap - 1) / cap);
  auto work = [](const StepItem& it) {
    return int64_t(it.count) * (it.first_pos + (it.count + 1) / 2) + it.count;
  };
  std::vector<StepItem> items = plan.items;
  std::stable_sort(items.begin(), items.end(),
                   [&](const StepItem& a, const StepItem& b) { return work(a) > work(b); });
  std::vector<std::vector<StepItem>> mb(groups);
  std::vector<int64_t> load(groups, 0);
  std::vector<int> tokens(groups, 0);
  for (const StepItem& it : items) {
    int best = -1;
    for (int g = 0; g < int(mb.size()); ++g)
      if (tokens[g] + it.count <= cap && (best < 0 || load[g] < load[best])) best = g;
    if (best < 0) {
      mb.emplace_back();
      load.push_back(0);
      tokens.push_back(0);
      best = int(mb.size()) - 1;
    }
    mb[best].push_back(it);
    load[best] += work(it);
    tokens[best] += it.count;
  }
  plan.items.clear();
  plan.micro_batch_end.clear();
  for (auto& group : mb) {
    if (group.empty()) continue;
    std::sort(group.begin(), group.end(),
              [](const StepItem& a, const StepItem& b) { return a.slot < b.slot; });
    plan.items.insert(plan.items.end(), group.begin(), group.end());
    plan.micro_batch_end.push_back(int(plan.items.size()));
  }
}

std::vector<Completion> Scheduler::complete_step(const StepPlan& plan,
                                                 const std::vector<int>& sampled) {
  std::vector<Completion> finished;
  size_t next_sample = 0;
  for (const StepItem& item : plan.items) {
    ActiveSequence& s = *slots_[item.slot];
    s.computed += item.count;
    if (!item.sample) continue;
    if (next_sample >= sampled.size()) fail("scheduler: fewer sampled tokens than sampling items");
    const int token = sampled[next_sample++];
    s.tokens.push_back(token);
    ++s.generated;
    const std::span<const int> generated = std::span<const int>(s.tokens).subspan(s.request.prompt.size());
    if (s.request.on_generated) s.request.on_generated(generated, s.logprobs);
    const auto& stops = s.request.stop_token_ids;
    const bool stop =
        (!s.request.ignore_eos && std::find(stops.begin(), stops.end(), token) != stops.end()) ||
        (s.request.stop_check && s.request.stop_check(generated));
    const bool limit =
        s.generated >= s.request.max_new_tokens || int(s.tokens.size()) >= max_positions_;
    if (!stop && !limit) continue;
    Completion c;
    c.id = s.request.id;
    c.prompt_tokens = int(s.request.prompt.size());
    c.tokens.assign(s.tokens.begin() + c.prompt_tokens, s.tokens.end());
    c.reason = stop ? FinishReason::kStop : FinishReason::kLength;
    c.logprobs = std::move(s.logprobs);
    finished.push_back(std::move(c));
    retire(item.slot);
  }
  return finished;
}

void Scheduler::retire(int slot) {
  ActiveSequence& s = *slots_[size_t(slot)];
  Pool& p = pool(s.pool);
  p.reserved -= s.reserved_blocks;
  --p.live;
  p.kv->release(slot);
  slots_[size_t(slot)].reset();
  --active_count_;
}

bool Scheduler::is_running(int64_t id) const {
  return std::any_of(slots_.begin(), slots_.end(),
                     [&](const auto& s) { return s && s->request.id == id; });
}

bool Scheduler::cancel(int64_t id) {
  auto queued = std::find_if(queue_.begin(), queue_.end(),
                             [&](const Request& r) { return r.id == id; });
  if (queued != queue_.end()) {
    queue_.erase(queued);
    return true;
  }
  for (size_t slot = 0; slot < slots_.size(); ++slot)
    if (slots_[slot] && slots_[slot]->request.id == id) {
      retire(int(slot));
      return true;
    }
  return false;
}

}  // namespace sluice
