// The offload pipeline's scheduling logic, driven through the CPU stand-in device: a realistic
// step (layers × micro-batches × experts, some attention weights streamed, small experts on the
// CPU, unused experts skipped) with slow simulated copies. Checks, from the stand-in's trace and
// from data the tasks see: no task computes before its pages arrived (and the bytes it reads are
// its pages, so no slot was overwritten early), copies never run more than `slots` pages ahead,
// the memory budget holds, every page is released, and host/device transfers are ordered.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "core/error.h"
#include "runtime/offload/cpu_standin_device.h"
#include "runtime/offload/step_pipeline.h"

namespace sluice::offload {
namespace {

constexpr int kLayers = 3, kExperts = 8, kMicroBatches = 3;
constexpr size_t kPageBytes = 4096;

// Tokens per expert, per layer: 0 means skipped; 1..2 small enough for the CPU.
int tokens_for(int layer, int expert) {
  static const int table[kExperts] = {40, 0, 2, 17, 1, 64, 9, 33};
  return table[(expert + layer) % kExperts];
}

struct Fixture {
  std::vector<std::vector<uint8_t>> host;  // the pages' host bytes
  std::vector<WeightPage> pages;
  std::vector<LayerPages> layers;
  std::map<std::string, std::string> last_user;  // page name -> label of its last user task

  int add_page(const std::string& name, size_t bytes, const std::string& user) {
    const int id = int(pages.size());
    host.emplace_back(bytes);
    for (size_t j = 0; j < bytes; ++j) host.back()[j] = uint8_t(id * 131 + j * 7);
    pages.push_back({host.back().data(), bytes, name});
    last_user[name] = user;
    return id;
  }

  Fixture() {
    host.reserve(1000);
    for (int l = 0; l < kLayers; ++l) {
      LayerPages L;
      // Layer 1's attention weights are streamed; layers 0 and 2 hold them resident.
      if (l == 1) {
        const std::string in = fmt::format("L{}.attn_in{}", l, kMicroBatches - 1);
        const std::string out = fmt::format("L{}.attn_out{}", l, kMicroBatches - 1);
        L.attention_in = {add_page(fmt::format("L{}.wqkv.0", l), kPageBytes, in),
                          add_page(fmt::format("L{}.wqkv.1", l), 1000, in)};
        L.attention_out = {add_page(fmt::format("L{}.wo.0", l), kPageBytes, out)};
      }
      for (int e = 0; e < kExperts; ++e) {
        const std::string user = fmt::format("L{}.e{}", l, e);
        L.experts.push_back({add_page(fmt::format("L{}.e{}.w1", l, e), kPageBytes, user),
                             add_page(fmt::format("L{}.e{}.w3", l, e), kPageBytes, user),
                             add_page(fmt::format("L{}.e{}.w2", l, e), 3000, user)});
      }
      layers.push_back(L);
    }
  }
};

// Test double for the math: every GPU task checks that its page slots hold exactly its pages'
// bytes, and the activations travel host↔device with values the next stage verifies.
class CheckingOps final : public StepOps {
 public:
  CheckingOps(Device& dev, const Fixture& f) : dev_(dev), f_(f) {
    for (int i = 0; i < kMicroBatches; ++i) {
      d_qkv_.push_back(static_cast<int*>(dev.allocate(sizeof(int), "qkv")));
      d_attn_.push_back(static_cast<int*>(dev.allocate(sizeof(int), "attn")));
      d_route_.push_back(static_cast<int*>(dev.allocate(sizeof(int), "routing")));
    }
    h_qkv_.resize(kMicroBatches);
    h_attn_.resize(kMicroBatches);
    h_route_.resize(kMicroBatches);
  }
  ~CheckingOps() override {
    for (auto* v : {&d_qkv_, &d_attn_, &d_route_})
      for (int* p : *v) dev_.deallocate(p, sizeof(int));
  }

  std::atomic<int> failures{0};
  std::vector<std::string> cpu_expert_runs;

  int micro_batches() const override { return kMicroBatches; }

  void check_pages(const std::vector<int>& ids, std::span<void* const> ptrs) {
    if (ids.size() != ptrs.size()) ++failures;
    for (size_t j = 0; j < ids.size() && j < ptrs.size(); ++j) {
      const WeightPage& p = f_.pages[size_t(ids[j])];
      if (std::memcmp(ptrs[j], p.host, p.bytes) != 0) ++failures;
    }
  }

  void attention_in(void*, int l, int mb, std::span<void* const> pages) override {
    check_pages(f_.layers[size_t(l)].attention_in, pages);
    *d_qkv_[size_t(mb)] = 1000 * l + mb;
  }
  Transfer qkv_to_host(int, int mb) override {
    return {&h_qkv_[size_t(mb)], d_qkv_[size_t(mb)], sizeof(int)};
  }
  void cpu_attention(int l, int mb) override {
    if (h_qkv_[size_t(mb)] != 1000 * l + mb) ++failures;  // the D2H finished before the host read
    h_attn_[size_t(mb)] = h_qkv_[size_t(mb)] + 7;
  }
  Transfer attention_to_device(int, int mb) override {
    return {d_attn_[size_t(mb)], &h_attn_[size_t(mb)], sizeof(int)};
  }
  void attention_out(void*, int l, int mb, std::span<void* const> pages) override {
    check_pages(f_.layers[size_t(l)].attention_out, pages);
    if (*d_attn_[size_t(mb)] != 1000 * l + mb + 7) ++failures;  // the H2D came first
    *d_route_[size_t(mb)] = 1000 * l + mb + 9;
  }
  Transfer routing_to_host(int, int mb) override {
    return {&h_route_[size_t(mb)], d_route_[size_t(mb)], sizeof(int)};
  }
  std::vector<int> expert_tokens(int l) override {
    for (int mb = 0; mb < kMicroBatches; ++mb)
      if (h_route_[size_t(mb)] != 1000 * l + mb + 9) ++failures;
    std::vector<int> t;
    for (int e = 0; e < kExperts; ++e) t.push_back(tokens_for(l, e));
    return t;
  }
  Transfer expert_rows_to_device(int) override { return {}; }
  void gpu_expert(void*, int l, int e, std::span<void* const> pages) override {
    check_pages(f_.layers[size_t(l)].experts[size_t(e)], pages);
    if (tokens_for(l, e) == 0) ++failures;
    if (int(dense_mlp_layers.size()) > l) ++failures;  // the layer's dense MLP ran before it
  }
  void cpu_expert(int l, int e) override {
    cpu_expert_runs.push_back(fmt::format("L{}.e{}", l, e));
  }
  Transfer cpu_experts_to_device(int) override { return {}; }
  void add_cpu_experts(void*, int) override {}
  void dense_mlp(void*, int l) override { dense_mlp_layers.push_back(l); }
  std::vector<int> dense_mlp_layers;  // in the order the compute queue ran them

 private:
  Device& dev_;
  const Fixture& f_;
  std::vector<int*> d_qkv_, d_attn_, d_route_;
  std::vector<int> h_qkv_, h_attn_, h_route_;
};

TEST(OffloadPipeline, StandinStepKeepsOrderWindowAndBudget) {
  Fixture f;
  const int slots = 7;  // a bit over double buffering of 3-page experts
  const size_t budget = slots * kPageBytes + 64 * 1024;
  // 400 MB/s: a 4 KiB page takes ~10 µs, slow enough that compute outruns the copies.
  CpuStandinDevice dev(budget, 400e6);
  auto checking_ops = std::make_unique<CheckingOps>(dev, f);
  CheckingOps& ops = *checking_ops;
  StepPipelineStats stats;
  {
    PageSlots pool(dev, kPageBytes, slots);
    stats = run_step(dev, pool, f.pages, f.layers, ops, {.cpu_expert_max_tokens = 2});
    dev.synchronize_all();
  }
  EXPECT_EQ(ops.failures.load(), 0);
  std::vector<int> every_layer(kLayers);
  for (int l = 0; l < kLayers; ++l) every_layer[size_t(l)] = l;
  EXPECT_EQ(ops.dense_mlp_layers, every_layer);  // once per layer, after its experts
  const int64_t cpu_expert_runs = int64_t(ops.cpu_expert_runs.size());
  const std::set<std::string> cpu_run(ops.cpu_expert_runs.begin(), ops.cpu_expert_runs.end());
  checking_ops.reset();  // its device buffers go back to the budget
  EXPECT_LE(dev.budget().peak(), budget);
  EXPECT_EQ(dev.budget().used(), 0u);  // slots and buffers all returned

  int expect_gpu = 0, expect_cpu_or_prefetched = 0, expect_skipped = 0;
  for (int l = 0; l < kLayers; ++l)
    for (int e = 0; e < kExperts; ++e) {
      const int t = tokens_for(l, e);
      if (t == 0)
        ++expect_skipped;
      else if (t <= 2)
        ++expect_cpu_or_prefetched;
      else
        ++expect_gpu;
    }
  EXPECT_EQ(stats.skipped_experts, expect_skipped);
  EXPECT_EQ(stats.gpu_experts + stats.cpu_experts, expect_gpu + expect_cpu_or_prefetched);
  EXPECT_GE(stats.gpu_experts, expect_gpu);
  EXPECT_EQ(cpu_expert_runs, stats.cpu_experts);
  EXPECT_GT(stats.cpu_experts, 0);  // the schedule exercises the CPU path

  // From the trace: copies of pages (labelled with the page name) and task runs.
  const std::vector<TraceEntry> trace = dev.trace();
  std::map<std::string, TraceEntry> copy_of, task;
  std::vector<TraceEntry> copies;
  for (const TraceEntry& e : trace) {
    if (e.queue == Queue::kWeights) {
      EXPECT_EQ(copy_of.count(e.label), 0u) << e.label << " copied twice";
      copy_of[e.label] = e;
      copies.push_back(e);
    } else if (e.queue == Queue::kCompute) {
      task[e.label] = e;
    }
  }
  EXPECT_EQ(int64_t(copies.size()), stats.pages_copied);
  // When a page's slot became free: after its last user ran, or, for an expert skipped after
  // its pages were prefetched (no tokens), after the compute work enqueued before the skip: the
  // previous expert that ran, or the layer's last attention_out.
  auto released_after = [&](const std::string& page) -> const TraceEntry& {
    const std::string& user = f.last_user.at(page);
    if (task.count(user)) return task.at(user);
    int l = -1, e = -1;
    EXPECT_EQ(std::sscanf(user.c_str(), "L%d.e%d", &l, &e), 2) << page << ": " << user;
    EXPECT_EQ(tokens_for(l, e), 0) << page << " copied but its expert " << user << " never ran";
    for (int prev = e - 1; prev >= 0; --prev) {
      const std::string label = fmt::format("L{}.e{}", l, prev);
      if (task.count(label)) return task.at(label);
    }
    return task.at(fmt::format("L{}.attn_out{}", l, kMicroBatches - 1));
  };
  for (const TraceEntry& c : copies) {
    const std::string& user = f.last_user.at(c.label);
    if (task.count(user)) {
      EXPECT_LT(c.end_tick, task[user].start_tick) << c.label;
    }
    EXPECT_EQ(cpu_run.count(user), 0u) << c.label << " copied for an expert the CPU ran";
    released_after(c.label);
  }
  // Experts beyond the prefetch window that got no tokens or ran on the CPU were never copied.
  EXPECT_LT(int64_t(copies.size()), int64_t(f.pages.size()));

  std::sort(copies.begin(), copies.end(),
            [](const TraceEntry& a, const TraceEntry& b) { return a.start_tick < b.start_tick; });
  for (size_t i = 0; i < copies.size(); ++i) {
    // Prefetch window: when copy i starts, pages copied earlier and still in use, plus this one,
    // fit in the slots.
    int in_use = 1;
    for (size_t j = 0; j < i; ++j)
      if (released_after(copies[j].label).end_tick > copies[i].start_tick) ++in_use;
    EXPECT_LE(in_use, slots) << "at " << copies[i].label;
    // A slot is overwritten only after its previous page's last user finished.
    for (size_t j = i; j-- > 0;)
      if (copies[j].dst == copies[i].dst) {
        EXPECT_GT(copies[i].start_tick, released_after(copies[j].label).end_tick)
            << copies[i].label << " overwrote " << copies[j].label;
        break;
      }
  }
}

TEST(OffloadPipeline, TooFewSlotsNamesTheMinimum) {
  CpuStandinDevice dev(1 << 20);
  std::vector<uint8_t> bytes(64);
  std::vector<WeightPage> pages = {
      {bytes.data(), 64, "a"}, {bytes.data(), 64, "b"}, {bytes.data(), 64, "c"}};
  PageSlots pool(dev, 64, 2);
  try {
    PageStreamer s(dev, pool, pages, {{0, 1, 2}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 3 slots"), std::string::npos) << e.what();
  }
}

TEST(OffloadPipeline, BudgetErrorNamesRequestAndBudget) {
  CpuStandinDevice dev(10000);
  try {
    PageSlots pool(dev, 4096, 3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("weight page slot 2"), std::string::npos) << m;
    EXPECT_NE(m.find("--gpu-mem budget"), std::string::npos) << m;
  }
  EXPECT_EQ(dev.budget().used(), 0u);  // the slots taken before the failure were returned
}

TEST(OffloadPipeline, StreamerReleasesEveryPageAndDropsSkipped) {
  CpuStandinDevice dev(1 << 20);
  std::vector<std::vector<uint8_t>> host(6, std::vector<uint8_t>(128));
  std::vector<WeightPage> pages;
  for (int i = 0; i < 6; ++i) {
    std::fill(host[size_t(i)].begin(), host[size_t(i)].end(), uint8_t(i + 1));
    pages.push_back({host[size_t(i)].data(), 128, fmt::format("p{}", i)});
  }
  PageSlots pool(dev, 128, 2);
  // Task 0 is skipped before its pages were copied: they are dropped.
  PageStreamer s(dev, pool, pages, {{0, 1}, {2, 3}, {4}, {5, 4}});
  std::atomic<int> bad{0};
  auto check = [&](std::vector<uint8_t> expect) {
    return [&bad, expect](void*, std::span<void* const> p) {
      if (p.size() != expect.size()) ++bad;
      for (size_t j = 0; j < p.size() && j < expect.size(); ++j)
        if (static_cast<const uint8_t*>(p[j])[127] != expect[j]) ++bad;
    };
  };
  s.skip(0);
  s.prefetch();
  EXPECT_EQ(s.pages_in_slots(), 2);  // the window: pages 2 and 3, no more
  s.run(1, check({3, 4}), "t1");
  s.run(2, check({5}), "t2");
  s.run(3, check({6, 5}), "t3");
  EXPECT_TRUE(s.finished());
  dev.synchronize_all();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(s.pages_in_slots(), 0);
  EXPECT_EQ(s.pages_copied(), 4);  // pages 0 and 1 were dropped, never copied
}

// The slots as a cache across steps: a second streamer over the same slots takes the pages the
// first one left in them without copying (their bytes are the right ones); with more slots than
// the copy window, the slots beyond it keep pages for good, not the last ones copied; a page
// without a key, or a slot left by another page list, is never taken.
TEST(OffloadPipeline, SlotsKeepPagesFromStepToStep) {
  CpuStandinDevice dev(1 << 20);
  constexpr int kPages = 8;
  std::vector<std::vector<uint8_t>> host(kPages, std::vector<uint8_t>(64));
  std::vector<WeightPage> pages;
  for (int i = 0; i < kPages; ++i) {
    std::fill(host[size_t(i)].begin(), host[size_t(i)].end(), uint8_t(i + 1));
    pages.push_back({host[size_t(i)].data(), 64, fmt::format("p{}", i)});
    pages.back().key = uint64_t(i) + 1;
  }
  std::vector<std::vector<int>> uses;  // one page per task, in order: a cyclic scan
  for (int i = 0; i < kPages; ++i) uses.push_back({i});
  PageSlots pool(dev, 64, 5);
  std::atomic<int> bad{0};
  auto step = [&](const std::vector<WeightPage>& list, int64_t* reused) {
    PageStreamer s(dev, pool, list, uses, nullptr, /*window=*/2);
    for (int t = 0; t < kPages; ++t)
      s.run(
          t,
          [&bad, t](void*, std::span<void* const> p) {
            if (static_cast<const uint8_t*>(p[0])[63] != uint8_t(t + 1)) ++bad;
          },
          "t");
    dev.synchronize_all();
    *reused = s.pages_reused();
    return s.pages_copied();
  };
  int64_t reused = 0;
  EXPECT_EQ(step(pages, &reused), kPages);  // the first step copies every page
  EXPECT_EQ(reused, 0);
  for (int round = 0; round < 3; ++round) {
    const int64_t copied = step(pages, &reused);
    EXPECT_EQ(copied + reused, kPages);
    // Slots for 5 of the 8 pages, two of them for the one in use and the one copied ahead: the
    // other 3 keep pages from step to step (FIFO reuse would keep none of a cyclic scan longer
    // than the slots).
    EXPECT_GE(reused, 3) << "round " << round;
  }
  EXPECT_EQ(bad.load(), 0);

  std::vector<WeightPage> unkeyed = pages;
  for (WeightPage& p : unkeyed) p.key = 0;
  EXPECT_EQ(step(unkeyed, &reused), kPages);
  EXPECT_EQ(reused, 0);
  step(pages, &reused);                   // fills the slots again, keyed
  std::vector<WeightPage> other = pages;  // another list: its keys name other bytes
  for (WeightPage& p : other) p.key += 100;
  EXPECT_EQ(step(other, &reused), kPages);
  EXPECT_EQ(reused, 0);
  EXPECT_EQ(bad.load(), 0);
}

// Pages whose host memory a source lends: none is copied ahead before the source has its bytes;
// a page of the task about to run is lent all the same (the source waits for its bytes); each is
// lent before its copy, and the source learns of every copy with an event that passes.
class FakeSource final : public PageSource {
 public:
  explicit FakeSource(int groups) : ready(size_t(groups), false), bytes(size_t(groups)) {
    for (int g = 0; g < groups; ++g)
      bytes[size_t(g)].assign(2, std::vector<uint8_t>(64, uint8_t(10 + g)));
  }
  bool available(const WeightPage& page) override { return ready[size_t(page.source_group)]; }
  void lend(WeightPage& page) override {
    page.host = bytes[size_t(page.source_group)][size_t(page.source_part)].data();
    lent.push_back(page.name);
  }
  void copied(const WeightPage& page, const EventPtr& event) override {
    copies.push_back({page.name, event});
  }
  std::vector<bool> ready;
  std::vector<std::vector<std::vector<uint8_t>>> bytes;  // [group][part]
  std::vector<std::string> lent;
  std::vector<std::pair<std::string, EventPtr>> copies;
};

TEST(OffloadPipeline, BorrowedPagesAreCopiedOnceTheirSourceHasThem) {
  CpuStandinDevice dev(1 << 20);
  std::vector<uint8_t> own(64, 1);
  std::vector<WeightPage> pages = {{own.data(), 64, "own"}};
  for (int g = 0; g < 2; ++g)
    for (int part = 0; part < 2; ++part)
      pages.push_back({.bytes = 64,
                       .name = fmt::format("g{}.{}", g, part),
                       .source_group = g,
                       .source_part = part});
  PageSlots pool(dev, 64, 4);
  FakeSource source(2);
  PageStreamer s(dev, pool, pages, {{0}, {1, 2}, {3, 4}}, &source);
  s.prefetch();
  EXPECT_EQ(s.pages_in_slots(), 1);  // the page with its own memory; group 0 is not there yet
  EXPECT_TRUE(source.lent.empty());
  source.ready[0] = true;
  s.prefetch();
  EXPECT_EQ(s.pages_in_slots(), 3);
  EXPECT_EQ(source.lent, (std::vector<std::string>{"g0.0", "g0.1"}));
  std::atomic<int> bad{0};
  auto expect = [&bad](uint8_t a, uint8_t b) {
    return [&bad, a, b](void*, std::span<void* const> p) {
      if (p.size() != 2 || static_cast<const uint8_t*>(p[0])[63] != a ||
          static_cast<const uint8_t*>(p[1])[63] != b)
        ++bad;
    };
  };
  s.run(
      0, [](void*, std::span<void* const>) {}, "t0");
  s.run(1, expect(10, 10), "t1");
  s.run(2, expect(11, 11), "t2");  // group 1 never said it was there: its task lends it anyway
  EXPECT_TRUE(s.finished());
  dev.synchronize_all();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(source.lent, (std::vector<std::string>{"g0.0", "g0.1", "g1.0", "g1.1"}));
  ASSERT_EQ(source.copies.size(), 4u);
  for (const auto& [name, event] : source.copies) {
    ASSERT_TRUE(event) << name;
    dev.synchronize(event);
  }
}

TEST(OffloadPipeline, ABorrowedPageWithoutASourceIsAnError) {
  CpuStandinDevice dev(1 << 20);
  std::vector<WeightPage> pages = {{.bytes = 64, .name = "g0.0", .source_group = 0}};
  PageSlots pool(dev, 64, 1);
  try {
    PageStreamer s(dev, pool, pages, {{0}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'source_group'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sluice::offload
