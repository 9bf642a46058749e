#include "runtime/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "test_util.h"

namespace sluice {
namespace {

KvCacheConfig small_kv(int blocks, int block_size = 4) {
  KvCacheConfig c;
  c.n_layers = 1;
  c.kv_heads = 1;
  c.head_dim = 8;
  c.block_size = block_size;
  c.total_blocks = blocks;
  return c;
}

Policy small_policy(int batch, int micro_batch = 64, int prefill = 64) {
  Policy p;
  p.batch = batch;
  p.attn_micro_batch = micro_batch;
  p.prefill_chunk = prefill;
  p.expert_batch = 64;
  return p;
}

Request request(int64_t id, int prompt_len, int max_new, std::vector<int> stops = {}) {
  Request r;
  r.id = id;
  r.prompt.assign(prompt_len, 7);
  r.max_new_tokens = max_new;
  r.stop_token_ids = std::move(stops);
  return r;
}

// Drives the scheduler to the end, answering every sample with `token_of(step, slot)`.
template <typename TokenFn>
std::map<int64_t, Completion> run_all(Scheduler& s, TokenFn token_of, int* steps = nullptr) {
  std::map<int64_t, Completion> done;
  int step = 0;
  while (!s.done()) {
    StepPlan plan = s.plan_step();
    EXPECT_FALSE(plan.empty()) << "scheduler stalled with work left";
    if (plan.empty()) break;
    std::vector<int> sampled;
    for (const StepItem& it : plan.items)
      if (it.sample) sampled.push_back(token_of(step, it.slot));
    for (Completion& c : s.complete_step(plan, sampled)) done[c.id] = std::move(c);
    ++step;
  }
  if (steps) *steps = step;
  return done;
}

TEST(Scheduler, RunsEveryRequestToItsLimit) {
  PagedKvCache kv(small_kv(64));
  Scheduler s(small_policy(3), kv, 1000);
  for (int i = 0; i < 7; ++i) s.submit(request(i, 3 + i, 2 + i % 3));
  auto done = run_all(s, [](int, int) { return 5; });
  ASSERT_EQ(done.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(done[i].tokens.size(), size_t(2 + i % 3));
    EXPECT_EQ(done[i].reason, FinishReason::kLength);
    EXPECT_EQ(done[i].prompt_tokens, 3 + i);
  }
  EXPECT_EQ(kv.free_blocks(), 64) << "every block returns to the pool";
  EXPECT_EQ(kv.live_sequences(), 0u);
}

TEST(Scheduler, StopTokenRetiresEarlyAndRefillsTheBatch) {
  PagedKvCache kv(small_kv(64));
  Scheduler s(small_policy(2), kv, 1000);
  for (int i = 0; i < 5; ++i) s.submit(request(i, 4, 10, {2}));
  int max_active = 0;
  std::map<int64_t, Completion> done;
  // The sequence in slot 0 emits EOS (2) on its third token; others never do.
  std::map<int, int> emitted;
  while (!s.done()) {
    StepPlan plan = s.plan_step();
    max_active = std::max(max_active, s.active());
    EXPECT_EQ(s.active(), std::min<int>(2, s.active() + int(s.waiting()))) << "batch kept full";
    std::vector<int> sampled;
    for (const StepItem& it : plan.items)
      if (it.sample)
        sampled.push_back(it.slot == 0 && ++emitted[int(s.sequence(0).request.id)] == 3 ? 2 : 9);
    for (Completion& c : s.complete_step(plan, sampled)) done[c.id] = std::move(c);
  }
  ASSERT_EQ(done.size(), 5u);
  EXPECT_EQ(max_active, 2);
  int stopped = 0;
  for (auto& [id, c] : done) {
    if (c.reason == FinishReason::kStop) {
      ++stopped;
      EXPECT_EQ(c.tokens.size(), 3u);
      EXPECT_EQ(c.tokens.back(), 2);
    } else {
      EXPECT_EQ(c.tokens.size(), 10u);
    }
  }
  EXPECT_GE(stopped, 1);
}

TEST(Scheduler, IgnoreEosGeneratesToTheLimit) {
  PagedKvCache kv(small_kv(16));
  Scheduler s(small_policy(1), kv, 1000);
  Request r = request(1, 2, 5, {2});
  r.ignore_eos = true;
  s.submit(r);
  auto done = run_all(s, [](int, int) { return 2; });
  EXPECT_EQ(done[1].tokens, std::vector<int>(5, 2));
  EXPECT_EQ(done[1].reason, FinishReason::kLength);
}

TEST(Scheduler, DefersAdmissionUntilKvBlocksFree) {
  // Each request needs (6 + 6) / 4 = 3 blocks; 7 blocks hold two at a time although B = 4.
  PagedKvCache kv(small_kv(7));
  Scheduler s(small_policy(4), kv, 1000);
  for (int i = 0; i < 5; ++i) s.submit(request(i, 6, 6));
  int max_active = 0;
  std::map<int64_t, Completion> done;
  while (!s.done()) {
    StepPlan plan = s.plan_step();
    max_active = std::max(max_active, s.active());
    EXPECT_GE(kv.free_blocks(), 0);
    std::vector<int> sampled;
    for (const StepItem& it : plan.items)
      if (it.sample) sampled.push_back(1);
    for (Completion& c : s.complete_step(plan, sampled)) done[c.id] = std::move(c);
  }
  EXPECT_EQ(max_active, 2);
  EXPECT_EQ(done.size(), 5u);
  EXPECT_EQ(kv.free_blocks(), 7);
}

TEST(Scheduler, ReusesReleasedBlocks) {
  // Each request needs (5 + 3) / 4 = 2 of the 3 blocks, so the second runs only in blocks the
  // first gave back.
  PagedKvCache kv(small_kv(3));
  Scheduler s(small_policy(2), kv, 1000);
  s.submit(request(1, 5, 3));
  s.submit(request(2, 5, 3));
  std::map<int64_t, std::set<int32_t>> blocks_of;
  std::map<int64_t, Completion> done;
  while (!s.done()) {
    StepPlan plan = s.plan_step();
    EXPECT_EQ(s.active(), 1);
    for (const StepItem& it : plan.items)
      for (int32_t b : kv.block_table(it.slot)) blocks_of[s.sequence(it.slot).request.id].insert(b);
    std::vector<int> sampled;
    for (const StepItem& it : plan.items)
      if (it.sample) sampled.push_back(1);
    for (Completion& c : s.complete_step(plan, sampled)) done[c.id] = std::move(c);
  }
  EXPECT_EQ(done.size(), 2u);
  EXPECT_EQ(blocks_of[1].size(), 2u);
  EXPECT_EQ(blocks_of[2].size(), 2u);
  std::vector<int32_t> shared;
  std::set_intersection(blocks_of[1].begin(), blocks_of[1].end(), blocks_of[2].begin(),
                        blocks_of[2].end(), std::back_inserter(shared));
  EXPECT_FALSE(shared.empty()) << "the second request reuses blocks the first released";
}

TEST(Scheduler, PrefillsInChunksWithinTheBudget) {
  PagedKvCache kv(small_kv(64));
  Scheduler s(small_policy(2, /*micro_batch=*/8, /*prefill=*/10), kv, 1000);
  s.submit(request(1, 25, 1));
  s.submit(request(2, 25, 1));
  int steps = 0;
  StepPlan plan = s.plan_step();
  EXPECT_EQ(plan.prefill_tokens, 10);
  for (const StepItem& it : plan.items) EXPECT_LE(it.count, 8) << "a chunk fits one micro-batch";
  std::vector<int> none;
  s.complete_step(plan, none);
  auto done = run_all(
      s, [](int, int) { return 1; }, &steps);
  EXPECT_EQ(done.size(), 2u);
  EXPECT_GE(steps + 1, 5) << "50 prompt tokens at 10 per step";
}

TEST(Scheduler, MicroBatchesRespectTheCapAndBalanceWork) {
  PagedKvCache kv(small_kv(400, 16));
  Scheduler s(small_policy(12, /*micro_batch=*/4, /*prefill=*/512), kv, 4000);
  // Prompts of very different lengths: after prefill, decode steps attend to their lengths.
  const int lengths[] = {200, 10, 180, 20, 150, 30, 120, 40, 100, 50, 60, 70};
  for (int i = 0; i < 12; ++i) s.submit(request(i, lengths[i], 250));
  std::vector<int> sampled;
  // Run until every sequence is decoding.
  StepPlan plan;
  for (int guard = 0; guard < 200; ++guard) {
    plan = s.plan_step();
    sampled.clear();
    for (const StepItem& it : plan.items)
      if (it.sample) sampled.push_back(1);
    if (plan.prefill_tokens == 0) break;
    s.complete_step(plan, sampled);
  }
  ASSERT_EQ(plan.decode_tokens, 12);
  ASSERT_EQ(plan.micro_batch_end.size(), 3u) << "12 tokens at 4 per micro-batch";
  std::vector<int64_t> work;
  int begin = 0;
  for (int end : plan.micro_batch_end) {
    int64_t w = 0;
    EXPECT_LE(end - begin, 4);
    for (int i = begin; i < end; ++i) w += plan.items[i].first_pos;
    work.push_back(w);
    begin = end;
  }
  int64_t total = std::accumulate(work.begin(), work.end(), int64_t(0));
  for (int64_t w : work) EXPECT_LE(w, total / 3 * 1.2) << "balanced within 20% of the mean";
}

// A request that can never run comes back from submit as a failed completion, and the others
// run without it; an empty prompt or no token to generate is the caller's bug, an error.
TEST(Scheduler, FailsRequestsThatCanNeverFitAlone) {
  PagedKvCache kv(small_kv(4));
  Scheduler s(small_policy(2), kv, 100);
  EXPECT_FALSE(s.submit(request(1, 5, 3)));
  std::optional<Completion> too_big = s.submit(request(9, 20, 20));
  ASSERT_TRUE(too_big);
  EXPECT_EQ(too_big->id, 9);
  EXPECT_EQ(too_big->reason, FinishReason::kError);
  EXPECT_EQ(too_big->failure, RequestFailure::kKvCacheTooSmall);
  EXPECT_EQ(too_big->prompt_tokens, 20);
  EXPECT_TRUE(too_big->tokens.empty());
  EXPECT_EQ(too_big->error,
            "20 prompt + 20 new tokens need 10 KV-cache blocks of 4 tokens; the largest KV pool "
            "has 4");
  std::optional<Completion> too_long = s.submit(request(8, 100, 1));
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->failure, RequestFailure::kPromptTooLong);
  EXPECT_NE(too_long->error.find("context holds 100"), std::string::npos) << too_long->error;
  // Capped by the context: 10 prompt + 90 new tokens stop at position 16, 4 blocks.
  PagedKvCache small(small_kv(4));
  Scheduler capped(small_policy(1), small, 16);
  EXPECT_FALSE(capped.submit(request(6, 10, 90)));
  EXPECT_ERROR_MENTIONS(s.submit(request(7, 0, 1)), "request 7", "empty");
  EXPECT_ERROR_MENTIONS(s.submit(request(5, 3, 0)), "request 5", "max_new_tokens");
  EXPECT_EQ(s.waiting(), 1u) << "only the request that fits is queued";
  auto done = run_all(s, [](int, int) { return 1; });
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[1].tokens.size(), 3u);
  EXPECT_EQ(done[1].reason, FinishReason::kLength);
}

// Two KV pools: the host cache and the device pool's books (no storage), as the offload engine
// keeps them.
KvCacheConfig books(int blocks, int block_size = 4) {
  KvCacheConfig c = small_kv(blocks, block_size);
  c.with_storage = false;
  return c;
}

// Every live sequence is in its recorded pool and only there, and no pool has promised more
// blocks than it has: the blocks its sequences hold plus those they reserved.
void expect_pools_consistent(const Scheduler& s, int batch) {
  int64_t promised[2] = {0, 0};
  for (int slot = 0; slot < batch; ++slot) {
    if (!s.kv(KvPool::kHost).contains(slot) &&
        !(s.has_device_pool() && s.kv(KvPool::kDevice).contains(slot)))
      continue;
    const ActiveSequence& q = s.sequence(slot);
    const KvPool other = q.pool == KvPool::kHost ? KvPool::kDevice : KvPool::kHost;
    EXPECT_TRUE(s.kv(q.pool).contains(slot)) << "slot " << slot;
    if (s.has_device_pool()) {
      EXPECT_FALSE(s.kv(other).contains(slot)) << "slot " << slot;
    }
    promised[q.pool == KvPool::kDevice] +=
        int64_t(s.kv(q.pool).block_table(slot).size()) + q.reserved_blocks;
  }
  EXPECT_LE(promised[0], s.kv(KvPool::kHost).total_blocks());
  if (s.has_device_pool()) {
    EXPECT_LE(promised[1], s.kv(KvPool::kDevice).total_blocks());
  }
}

// Counts of the live sequences in each pool after the first step.
std::pair<int, int> placed(Scheduler& s, int batch) {
  s.plan_step();
  int host = 0, device = 0;
  for (int slot = 0; slot < batch; ++slot) {
    if (s.kv(KvPool::kHost).contains(slot)) ++host;
    if (s.kv(KvPool::kDevice).contains(slot)) ++device;
  }
  expect_pools_consistent(s, batch);
  return {host, device};
}

// Runs to the end answering 1 to every sample; returns the most sequences active at once.
int run_counting_active(Scheduler& s, int batch, std::map<int64_t, Completion>* done) {
  int max_active = 0;
  while (!s.done()) {
    StepPlan plan = s.plan_step();
    EXPECT_FALSE(plan.empty()) << "scheduler stalled with work left";
    if (plan.empty()) break;
    max_active = std::max(max_active, s.active());
    expect_pools_consistent(s, batch);
    std::vector<int> sampled;
    for (const StepItem& it : plan.items)
      if (it.sample) sampled.push_back(1);
    for (Completion& c : s.complete_step(plan, sampled)) (*done)[c.id] = std::move(c);
  }
  return max_active;
}

TEST(SchedulerTwoPools, PlacementFollowsTheCpuShare) {
  // Room for everything in both pools: placement is ω's alone, round(ω · 8) of 8 on the host.
  for (double omega : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    SCOPED_TRACE(omega);
    PagedKvCache host(small_kv(100)), device(books(100));
    Scheduler s(small_policy(8), host, 1000, {&device, omega});
    for (int i = 0; i < 8; ++i) s.submit(request(i, 5, 3));
    const auto [on_host, on_device] = placed(s, 8);
    EXPECT_EQ(on_host, std::llround(omega * 8));
    EXPECT_EQ(on_device, 8 - on_host);
    EXPECT_EQ(s.device_turns_to_host(), 0);
  }
}

TEST(SchedulerTwoPools, TheSplitStaysNearTheShareAsSequencesComeAndGo) {
  // ω = 0.5 with sequences of different lengths retiring at different steps. Sequences never
  // move, but each refill places new ones towards round(ω · n): while requests wait (the batch is
  // full) the host holds within one of round(ω · n) of the n live sequences.
  PagedKvCache host(small_kv(100)), device(books(100));
  Scheduler s(small_policy(4), host, 1000, {&device, 0.5});
  for (int i = 0; i < 12; ++i) s.submit(request(i, 2 + i % 5, 1 + i % 4));
  int steps_with_both = 0;
  std::map<int64_t, Completion> done;
  while (!s.done()) {
    StepPlan plan = s.plan_step();
    ASSERT_FALSE(plan.empty());
    int on_host = 0;
    for (int slot = 0; slot < 4; ++slot) on_host += s.kv(KvPool::kHost).contains(slot);
    const int n = s.active();
    if (s.waiting() > 0) {
      EXPECT_LE(std::abs(on_host - int(std::llround(0.5 * n))), 1) << "live " << n;
    }
    steps_with_both += on_host > 0 && on_host < n;
    std::vector<int> sampled;
    for (const StepItem& it : plan.items)
      if (it.sample) sampled.push_back(1);
    for (Completion& c : s.complete_step(plan, sampled)) done[c.id] = std::move(c);
  }
  EXPECT_EQ(done.size(), 12u);
  EXPECT_GT(steps_with_both, 0);
}

TEST(SchedulerTwoPools, FallsBackToTheOtherPoolWhenFull) {
  // Each request needs (6 + 6) / 4 = 3 blocks. ω = 0.5 asks for 4 of 8 on each side.
  {  // The host pool holds 2: the others go to the device pool, all 8 run at once.
    PagedKvCache host(small_kv(6)), device(books(100));
    Scheduler s(small_policy(8), host, 1000, {&device, 0.5});
    for (int i = 0; i < 8; ++i) s.submit(request(i, 6, 6));
    const auto [on_host, on_device] = placed(s, 8);
    EXPECT_EQ(on_host, 2);
    EXPECT_EQ(on_device, 6);
    EXPECT_EQ(s.device_turns_to_host(), 0) << "only device turns that went to the host count";
  }
  {  // The device pool holds 2: the host takes the rest. Turns (host first at n = 1, then
     // alternating): the device's at n = 2, 4 fit; at n = 6, 7, 8 it is full, 3 go to the host.
    PagedKvCache host(small_kv(100)), device(books(6));
    Scheduler s(small_policy(8), host, 1000, {&device, 0.5});
    for (int i = 0; i < 8; ++i) s.submit(request(i, 6, 6));
    const auto [on_host, on_device] = placed(s, 8);
    EXPECT_EQ(on_host, 6);
    EXPECT_EQ(on_device, 2);
    EXPECT_EQ(s.device_turns_to_host(), 3);
  }
}

TEST(SchedulerTwoPools, WaitsWhenNeitherPoolHasRoomAndReturnsBlocksToTheirPool) {
  // 3 blocks per request, 6 in each pool: 4 at a time although B = 8.
  PagedKvCache host(small_kv(6)), device(books(6));
  Scheduler s(small_policy(8), host, 1000, {&device, 0.5});
  for (int i = 0; i < 10; ++i) s.submit(request(i, 6, 6));
  StepPlan first = s.plan_step();
  EXPECT_EQ(s.active(), 4);
  EXPECT_EQ(s.waiting(), 6u);
  EXPECT_EQ(host.free_blocks(), 6 - 2 * 2) << "two sequences' 6-token prompts, 2 blocks each";
  EXPECT_EQ(device.free_blocks(), 6 - 2 * 2);
  std::vector<int> sampled;
  for (const StepItem& it : first.items)
    if (it.sample) sampled.push_back(1);
  s.complete_step(first, sampled);
  std::map<int64_t, Completion> done;
  EXPECT_EQ(run_counting_active(s, 8, &done), 4);
  EXPECT_EQ(done.size(), 10u);
  for (auto& [id, c] : done) EXPECT_EQ(c.tokens.size(), 6u) << "request " << id;
  EXPECT_EQ(host.free_blocks(), 6);
  EXPECT_EQ(device.free_blocks(), 6);
  EXPECT_EQ(host.live_sequences(), 0u);
  EXPECT_EQ(device.live_sequences(), 0u);
}

TEST(SchedulerTwoPools, ARequestTooBigForTheHostPoolRunsInTheDevicePool) {
  // 20 + 12 tokens need 8 blocks: the host pool has 4, the device pool 10. With ω = 1 every
  // turn is the host's; this one goes to the device pool all the same.
  PagedKvCache host(small_kv(4)), device(books(10));
  Scheduler s(small_policy(2), host, 1000, {&device, 1.0});
  s.submit(request(1, 20, 12));
  s.submit(request(2, 3, 2));
  std::map<int64_t, Completion> done;
  run_counting_active(s, 2, &done);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[1].tokens.size(), 12u);
  EXPECT_EQ(done[2].tokens.size(), 2u);
  EXPECT_EQ(s.device_turns_to_host(), 0);
  EXPECT_EQ(device.free_blocks(), 10);
  // Too big for either pool: fails alone, naming the largest.
  std::optional<Completion> failed = s.submit(request(3, 30, 20));
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->failure, RequestFailure::kKvCacheTooSmall);
  EXPECT_NE(failed->error.find("the largest KV pool has 10"), std::string::npos) << failed->error;
}

TEST(SchedulerTwoPools, BothPoolsRunMoreSequencesAtOnceThanTheHostPoolAlone) {
  // 3 blocks per request, 6 host blocks: 2 at a time on the host alone, 4 with a device pool of
  // 6 more, so the run takes fewer steps.
  int most[2] = {0, 0}, steps[2] = {0, 0};
  for (int with_device = 0; with_device < 2; ++with_device) {
    PagedKvCache host(small_kv(6)), device(books(6));
    Scheduler s(small_policy(8), host, 1000,
                with_device ? DeviceKvPool{&device, 0.5} : DeviceKvPool{});
    for (int i = 0; i < 8; ++i) s.submit(request(i, 6, 6));
    std::map<int64_t, Completion> done;
    while (!s.done()) {
      StepPlan plan = s.plan_step();
      ASSERT_FALSE(plan.empty());
      most[with_device] = std::max(most[with_device], s.active());
      ++steps[with_device];
      std::vector<int> sampled;
      for (const StepItem& it : plan.items)
        if (it.sample) sampled.push_back(1);
      for (Completion& c : s.complete_step(plan, sampled)) done[c.id] = std::move(c);
    }
    EXPECT_EQ(done.size(), 8u);
  }
  EXPECT_EQ(most[0], 2);
  EXPECT_EQ(most[1], 4);
  // Waves of admitted sequences, each a prefill step and 5 more decode steps.
  EXPECT_EQ(steps[0], 4 * 6);
  EXPECT_EQ(steps[1], 2 * 6);
}

TEST(SchedulerTwoPools, RefusesMismatchedPools) {
  PagedKvCache host(small_kv(8)), device(books(8, /*block_size=*/8));
  EXPECT_ERROR_MENTIONS(Scheduler(small_policy(2), host, 100, {&device, 0.5}), "block_size");
  PagedKvCache same(books(8));
  EXPECT_ERROR_MENTIONS(Scheduler(small_policy(2), host, 100, {&same, 1.5}), "cpu_share", "[0, 1]");
}

}  // namespace
}  // namespace sluice
